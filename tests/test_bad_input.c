/*
 * Bad input, every kind kvlab reads today (issue 15): checkpoint files, tokenizer files,
 * needle specs, dialogues, request traces (with chapter 07's priority column) and
 * command-line arguments (chapter 07/08's serve options, bench swap, bench attention, tour;
 * chapter 09's needle --chunk and spec-file predictions; chapters 09 and 10's command lines are
 * in test_bad_input2.c).
 * For each: truncated, oversized, wrong magic or shape, NaN/inf, negative or absurd sizes,
 * unknown fields or choices, output paths that cannot be written.
 *
 * Library: an error status (never KV_OK, never a crash), a message naming the problem, the
 * output struct left empty, and no file (or temporary file) left behind by a failed write.
 * CLI:     exit code 2, a message on stderr naming the input, nothing on stdout, no crash,
 *          and no file created in the working directory.
 *
 * usage: test_bad_input <path to kvlab>
 */
#define _GNU_SOURCE
#include "kv_checkpoint.h"
#include "kv_file.h"
#include "kv_dialogue.h"
#include "kv_needle.h"
#include "kv_tokenizer.h"
#include "kv_trace.h"
#include "common/kv_test.h"
#include "common/kv_test_cli.h"

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>

static void put32(unsigned char *b, size_t off, int32_t v) { memcpy(b + off, &v, 4); }
static void putf(unsigned char *b, size_t off, float v) { memcpy(b + off, &v, 4); }

/* ---- checkpoints ------------------------------------------------------------------------ */

/* dim 8, hidden 8, L 1, H 2, H_kv 1 (d 4), vocab 300, seq 16; untied, so both tables exist */
static void small_model(kv_model *m, int tied)
{
    kv_config c = {8, 8, 1, 2, 1, 300, 16, 0, 0, 0, 0, 0, 0, {0}};
    kv_config_set_defaults(&c);
    c.tied_classifier = tied;
    kv_err err;
    if (kv_model_alloc(m, &c, &err)) {
        printf("model: %s\n", err.msg);
        exit(1);
    }
    kv_model_randomize(m, 3);
}

/* Expect kv_checkpoint_read(p) to fail with @p status and a message containing every word
 * of @p want (words separated by '|'), and leave the model zeroed. */
static void expect_ckpt_fail(const char *p, int status, const char *want, const char *what)
{
    kv_model m;
    memset(&m, 0x5a, sizeof m);
    kv_err err = {{0}};
    int rc = kv_checkpoint_read(p, &m, &err);
    KV_CHECK(rc == status, "checkpoint %s: status %s, expected %s (%s)", what, kv_status_name(rc),
             kv_status_name(status), err.msg);
    char words[256];
    snprintf(words, sizeof words, "%s", want);
    for (char *w = strtok(words, "|"); w; w = strtok(NULL, "|"))
        KV_CHECK(strstr(err.msg, w) != NULL, "checkpoint %s: message lacks '%s': %s", what, w, err.msg);
    KV_CHECK(m.data == NULL && m.n_floats == 0, "checkpoint %s: model not left empty", what);
    if (rc == KV_OK) kv_model_free(&m);
}

/* the valid kvlab file with one change: put32/putf at @p off, or cut/extend to @p size */
static const char *ckpt_variant(const unsigned char *good, size_t n, const char *name, long off,
                                int is_float, double value, long size)
{
    size_t len = size >= 0 ? (size_t)size : n;
    unsigned char *b = calloc(len + 1, 1);
    memcpy(b, good, len < n ? len : n);
    if (off >= 0) {
        if (is_float) putf(b, (size_t)off, (float)value);
        else put32(b, (size_t)off, (int32_t)value);
    }
    const char *p = file(name);
    write_bytes(p, b, len);
    free(b);
    return p;
}

static void test_checkpoint(void)
{
    kv_model m;
    small_model(&m, 0);
    kv_err err = {{0}};
    const char *good_kv = file("good.kvlab"), *good_l2 = file("good.llama2c");
    KV_CHECK(kv_checkpoint_write(good_kv, &m, KV_FILE_KVLAB, &err) == KV_OK, "write: %s", err.msg);
    KV_CHECK(kv_checkpoint_write(good_l2, &m, KV_FILE_LLAMA2C, &err) == KV_OK, "write: %s", err.msg);
    size_t n = 0, n2 = 0;
    unsigned char *g = slurp(good_kv, &n), *g2 = slurp(good_l2, &n2);
    kv_model back;
    KV_CHECK(g && g2 && kv_checkpoint_read(good_kv, &back, &err) == KV_OK, "valid file refused: %s", err.msg);
    kv_model_free(&back);
    if (!g || !g2) return;
    /* kvlab header offsets: 4 version, 8 dim, 12 hidden, 16 L, 20 H, 24 H_kv, 28 vocab,
     * 32 seq, 36 theta, 40 rotary, 44 eps, 48 tied, 52 kind, 56..255 zero; weights from 256 */
    const int F = KV_ERR_FORMAT;
    struct { const char *name; long off; int is_float; double value; long size; const char *want; } v[] = {
        /* truncated */
        {"empty", -1, 0, 0, 0, "empty"},
        {"cut-header", -1, 0, 0, 100, "truncated|256"},
        {"cut-weights", -1, 0, 0, (long)n - 4, "truncated|expected"},
        /* oversized */
        {"trailing", -1, 0, 0, (long)n + 4, "4 trailing bytes"},
        /* wrong magic, version, shape */
        {"magic-ak42", 0, 0, 0x616b3432, -1, "ak42"},
        {"version-2", 4, 0, 2, -1, "version 2"},
        {"heads-not-dividing", 20, 0, 3, -1, "n_heads (3) must divide dim (8)"},
        {"kv-heads-above", 24, 0, 4, -1, "n_kv_heads (4)"},
        {"odd-head-dim", 20, 0, 8, -1, "even"},
        {"rotary-odd", 40, 0, 3, -1, "rotary_dim"},
        /* NaN / inf in the header and in the weights */
        {"theta-nan", 36, 1, NAN, -1, "rope_theta"},
        {"eps-inf", 44, 1, INFINITY, -1, "norm_eps"},
        {"weight-nan", 256 + 4 * 17, 1, NAN, -1, "NaN|token_embedding"},
        {"weight-inf", (long)n - 4, 1, -INFINITY, -1, "inf"},
        /* negative or absurd sizes */
        {"dim-negative", 8, 0, -8, -1, "dim (-8)"},
        {"layers-zero", 16, 0, 0, -1, "n_layers (0)"},
        {"seq-intmax", 32, 0, INT_MAX, -1, "seq_len"},
        {"vocab-intmin", 28, 0, INT_MIN, -1, "vocab_size"},
        {"hidden-absurd", 12, 0, 1 << 30, -1, "hidden_dim"},
        /* a valid shape (dim 65536: 1.3e10 weights) that this small file cannot hold */
        {"dims-huge", 8, 0, 65536, -1, "truncated|expected"},
        /* unknown fields: the padding where later versions put new fields, kind, tied flag */
        {"padding", 100, 0, 1, -1, "padding byte 100"},
        {"kind-7", 52, 0, 7, -1, "kind (7)"},
        {"tied-2", 48, 0, 2, -1, "tied_classifier (2)"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        const char *p = ckpt_variant(g, n, v[i].name, v[i].off, v[i].is_float, v[i].value, v[i].size);
        expect_ckpt_fail(p, F, v[i].want, v[i].name);
    }

    /* llama2.c files: seven int32, no magic */
    struct { const char *name; int field; int32_t value; long size; const char *want; } l[] = {
        {"l2-short-header", -1, 0, 20, "truncated header|KVLB"},
        {"l2-zero-dim", 0, 0, -1, "not a valid llama2.c header|dim (0)"},
        {"l2-negative-seq", 6, -16, -1, "seq_len (-16)"},
        {"l2-vocab-intmin", 5, INT_MIN, -1, "vocab_size"},
        {"l2-wrong-vocab", 5, -301, -1, "expected"},
        {"l2-trailing", -1, 0, (long)n2 + 1, "1 trailing bytes"},
    };
    for (size_t i = 0; i < sizeof l / sizeof l[0]; i++) {
        const char *p = ckpt_variant(g2, n2, l[i].name, l[i].field >= 0 ? 4L * l[i].field : -1, 0,
                                     l[i].value, l[i].size);
        expect_ckpt_fail(p, F, l[i].want, l[i].name);
    }
    /* not a file at all */
    expect_ckpt_fail(dir, KV_ERR_IO, "Is a directory", "a folder");
    expect_ckpt_fail(file("missing.bin"), KV_ERR_IO, "cannot open|missing.bin", "missing file");

    /* writes that fail leave neither the file nor a temporary behind */
    const char *nope = file("nosuchdir/out.bin");
    KV_CHECK(kv_checkpoint_write(nope, &m, KV_FILE_KVLAB, &err) == KV_ERR_IO &&
                 strstr(err.msg, "nosuchdir") != NULL, "write into a missing folder: %s", err.msg);
    m.config.rope_theta = 500000.0f; /* not expressible in a llama2.c header */
    const char *l2 = file("theta.llama2c");
    KV_CHECK(kv_checkpoint_write(l2, &m, KV_FILE_LLAMA2C, &err) == KV_ERR_UNSUPPORTED &&
                 strstr(err.msg, "rope_theta") != NULL && !exists(l2), "unsupported llama2.c write: %s", err.msg);
    m.config.rope_theta = 10000.0f;
    /* a write cut short by the file-size limit (as a full disk would): EFBIG mid-file */
    struct rlimit old, small = {2048, 0};
    getrlimit(RLIMIT_FSIZE, &old);
    small.rlim_max = old.rlim_max;
    signal(SIGXFSZ, SIG_IGN);
    const char *cut = file("cut-short.bin");
    int rc = setrlimit(RLIMIT_FSIZE, &small) == 0 ? kv_checkpoint_write(cut, &m, KV_FILE_KVLAB, &err) : -1;
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);
    KV_CHECK(rc == KV_ERR_IO && !exists(cut), "write cut short: status %d, file %s (%s)", rc,
             exists(cut) ? "left behind" : "absent", err.msg);
    KV_CHECK(count_files(KV_FILE_TMP_PREFIX) == 0, "a failed write left a temporary file");
    free(g);
    free(g2);
    kv_model_free(&m);
}

/* ---- tokenizer files -------------------------------------------------------------------- */

static void expect_tok_fail(const char *p, int vocab, int status, const char *want, const char *what)
{
    kv_tokenizer t;
    memset(&t, 0x5a, sizeof t);
    kv_err err = {{0}};
    int rc = kv_tokenizer_read(p, vocab, &t, &err);
    KV_CHECK(rc == status, "tokenizer %s: status %s, expected %s (%s)", what, kv_status_name(rc),
             kv_status_name(status), err.msg);
    KV_CHECK(strstr(err.msg, want) != NULL, "tokenizer %s: message lacks '%s': %s", what, want, err.msg);
    KV_CHECK(t.vocab == NULL && t.vocab_size == 0, "tokenizer %s: not left empty", what);
    if (rc == KV_OK) kv_tokenizer_free(&t);
}

static void test_tokenizer(void)
{
    kv_tokenizer t;
    kv_err err = {{0}};
    if (kv_tokenizer_bytes(&t, 300, &err)) {
        KV_CHECK(0, "byte tokenizer: %s", err.msg);
        return;
    }
    char good[256]; /* a copy: file() reuses its buffers */
    snprintf(good, sizeof good, "%s", file("good.tok"));
    KV_CHECK(kv_tokenizer_write(good, &t, &err) == KV_OK, "write: %s", err.msg);
    size_t n = 0;
    unsigned char *g = slurp(good, &n);
    if (!g) return;
    kv_tokenizer back;
    KV_CHECK(kv_tokenizer_read(good, 300, &back, &err) == KV_OK, "valid file refused: %s", err.msg);
    kv_tokenizer_free(&back);
    /* layout: 0 max_token_length, then per token: score f32, length i32, bytes.
     * token 0 "<unk>" sits at 4 (score), 8 (length), 12.. (5 bytes) */
    unsigned char *b = malloc(n + 8);
    const int F = KV_ERR_FORMAT;
#define VARIANT(name, size, edit)                                                           \
    do {                                                                                    \
        memcpy(b, g, n);                                                                    \
        edit;                                                                               \
        write_bytes(file(name), b, (size));                                                 \
    } while (0)
    VARIANT("tok-empty", 0, (void)0);
    expect_tok_fail(file("tok-empty"), 300, F, "no max_token_length", "empty");
    VARIANT("tok-cut", n - 3, (void)0);
    expect_tok_fail(file("tok-cut"), 300, F, "truncated", "truncated in a token");
    VARIANT("tok-trailing", n + 2, (b[n] = 1, b[n + 1] = 2));
    expect_tok_fail(file("tok-trailing"), 300, F, "trailing bytes", "trailing bytes");
    /* the file holds 300 tokens: asked for another count it is too long or too short */
    expect_tok_fail(good, 299, F, "trailing bytes", "vocab_size one short");
    expect_tok_fail(good, 301, F, "truncated at token 300", "vocab_size one long");
    VARIANT("tok-maxlen-0", n, put32(b, 0, 0));
    expect_tok_fail(file("tok-maxlen-0"), 300, F, "max_token_length (0)", "max_token_length 0");
    VARIANT("tok-maxlen-huge", n, put32(b, 0, 1 << 30));
    expect_tok_fail(file("tok-maxlen-huge"), 300, F, "max_token_length", "absurd max_token_length");
    VARIANT("tok-score-nan", n, putf(b, 4, NAN));
    expect_tok_fail(file("tok-score-nan"), 300, F, "score of token 0 is NaN", "NaN score");
    VARIANT("tok-score-inf", n, putf(b, 4, INFINITY));
    expect_tok_fail(file("tok-score-inf"), 300, F, "infinite", "inf score");
    VARIANT("tok-len-negative", n, put32(b, 8, -1));
    expect_tok_fail(file("tok-len-negative"), 300, F, "token 0 has length -1", "negative length");
    VARIANT("tok-len-absurd", n, put32(b, 8, INT_MAX));
    expect_tok_fail(file("tok-len-absurd"), 300, F, "token 0 has length", "absurd length");
#undef VARIANT
    /* vocab sizes the caller passes: negative, zero, absurd */
    expect_tok_fail(good, 0, KV_ERR_ARG, "vocab_size (0)", "vocab_size 0");
    expect_tok_fail(good, -5, KV_ERR_ARG, "vocab_size (-5)", "vocab_size -5");
    expect_tok_fail(good, INT_MAX, KV_ERR_ARG, "vocab_size", "vocab_size INT_MAX");
    expect_tok_fail(file("missing.tok"), 300, KV_ERR_IO, "missing.tok", "missing file");

    /* a failed write leaves nothing behind */
    t.lengths[5] = t.max_token_length + 1;
    const char *w = file("bad-write.tok");
    KV_CHECK(kv_tokenizer_write(w, &t, &err) == KV_ERR_ARG && !exists(w) &&
                 count_files(KV_FILE_TMP_PREFIX) == 0,
             "tokenizer write of a bad length: %s", err.msg);
    t.lengths[5] = 6;
    free(b);
    free(g);
    kv_tokenizer_free(&t);
}

/* ---- needle specs and dialogues (datasets/) ---------------------------------------------- */

static void expect_needle_fail(const char *text, const char *want)
{
    kv_needle_spec s;
    kv_needle_spec_default(&s);
    kv_err err = {{0}};
    int rc = kv_needle_spec_parse(text, &s, &err);
    KV_CHECK(rc == KV_ERR_FORMAT && strstr(err.msg, want) != NULL,
             "needle spec '%.40s': status %d, message '%s' (wanted '%s')", text, rc, err.msg, want);
}

static void expect_dialogue_fail(const char *text, const char *want)
{
    kv_dialogue d;
    kv_err err = {{0}};
    int rc = kv_dialogue_parse(text, "bad", &d, &err);
    KV_CHECK(rc == KV_ERR_FORMAT && strstr(err.msg, want) != NULL && d.turns == NULL,
             "dialogue '%.40s': status %d, message '%s' (wanted '%s')", text, rc, err.msg, want);
    if (rc == KV_OK) kv_dialogue_free(&d);
}

static void test_datasets(void)
{
    expect_needle_fail("colour blue\n", "unknown field 'colour'");
    expect_needle_fail("lengths 1024 -5\n", "'-5'");
    expect_needle_fail("lengths 99999999999999999999\n", "lengths");
    expect_needle_fail("depths 50 101\n", "'101'");
    expect_needle_fail("depths nan\n", "'nan'");
    expect_needle_fail("seeds 1 2 3 4 5 6 7 8 9\n", "at most 8 seeds");
    expect_needle_fail("variant fp32 within:-1\n", "within:-1");
    expect_needle_fail("models\n", "needs a value");
    /* chapter 09's predictions and the chunk field: numbers missing, negative, extra words,
     * garbage after them; each message names the line */
    struct { const char *text, *want; } nr[] = {
        {"variant h2o/b64/w16 kept:\n", "line 1|'kept:' needs two numbers E,W"},
        {"name a\nvariant h2o/b64/w16 kept:5\n", "line 2|'kept:5'"},
        {"variant h2o/b64/w16 kept:,16\n", "line 1|'kept:,16'"},
        {"variant h2o/b64/w16 kept:-1,16\n", "line 1|'kept:-1,16'"},
        {"variant h2o/b64/w16 kept:3,-16\n", "line 1|'kept:3,-16'"},
        {"variant h2o/b64/w16 kept:3,16,2\n", "line 1|'kept:3,16,2'"},
        {"variant h2o/b64/w16 kept:3,16x\n", "line 1|'kept:3,16x'"},
        /* longer than the rule's copy: the cut tail ("garbage") was ignored and W read as 0 */
        {"variant h2o/b64/w16 kept:0,00000000000000000000000000000000016garbage\n", "line 1|too long"},
        {"variant h2o/b64/w16 atleast:\n", "line 1|'atleast:' needs two numbers"},
        {"\n\nvariant h2o/b64/w16 atleast:0\n", "line 3|'atleast:0'"},
        {"variant snapkv/b64/w16 atleast:a,b\n", "line 1|'atleast:a,b'"},
        {"variant h2o/b64/w16 from:\n", "line 1|bad position in 'from:'"},
        {"variant h2o/b64/w16 from:-5\n", "line 1|'from:-5'"},
        {"variant h2o/b64/w16 from:12x\n", "line 1|'from:12x'"},
        {"variant fp32 page-split:\n", "line 1|bad page size in 'page-split:'"},
        {"variant fp32 page-split:0\n", "line 1|'page-split:0'"},
        {"variant fp32 page-split:-16\n", "line 1|'page-split:-16'"},
        {"variant fp32 page-split:2000000\n", "line 1|'page-split:2000000'"},
        {"variant h2o/b64/w16 kept:3,16 all\n", "line 1|variant SPEC [PREDICTION]"},
        {"variant h2o/b64/w16 nope:3\n", "line 1|unknown prediction 'nope:3'"},
        {"# chunked\nchunk\n", "line 2|'chunk' needs a value"},
        {"chunk -4\n", "line 1|bad chunk '-4'"},
        {"chunk 0\n", "line 1|bad chunk '0'"},
        {"chunk 64 128\n", "line 1|chunk takes one number"},
        {"chunk 64x\n", "line 1|bad chunk '64x'"},
        {"chunk 16777217\n", "line 1|bad chunk '16777217'"},
        {"chunk 99999999999999999999\n", "line 1|bad chunk"},
        {"model-seed 1 2\n", "line 1|model-seed takes one number"},
    };
    for (size_t i = 0; i < sizeof nr / sizeof nr[0]; i++) {
        kv_needle_spec s;
        kv_needle_spec_default(&s);
        kv_err err = {{0}};
        char words[128];
        const int rc = kv_needle_spec_parse(nr[i].text, &s, &err);
        KV_CHECK(rc == KV_ERR_FORMAT, "needle spec '%.50s': status %d (%s)", nr[i].text, rc, err.msg);
        snprintf(words, sizeof words, "%s", nr[i].want);
        for (char *w = strtok(words, "|"); w; w = strtok(NULL, "|"))
            KV_CHECK(strstr(err.msg, w) != NULL, "needle spec '%.50s': message lacks '%s': %s",
                     nr[i].text, w, err.msg);
    }
    /* chapter 06 and 09 cache variants (kv_needle_cache_spec): refused with a message naming
     * them */
    struct { const char *variant, *want; } cv[] = {
        {"nosuch/b64", "'nosuch/b64' is not known"},
        {"h2o", "needs a budget"},
        {"h2o/w16", "needs a budget"},
        {"h2o/b0", "needs a budget"},
        {"h2o/b64/r0.5", "one budget"},
        {"h2o/r0", "ratio '0'"},
        {"h2o/r1.5", "ratio '1.5'"},
        {"h2o/rnan", "ratio 'nan'"},
        {"h2o/r0x1p-1", "ratio '0x1p-1'"}, /* strtod read it as 0.5 */
        {"h2o/r 0.5", "ratio ' 0.5'"},     /* and this one too */
        {"h2o/b64/w-1", "'w-1' needs a count"},
        {"h2o/b64/s-2", "'s-2' needs a count"},
        {"quest/b64/d-1", "'d-1' needs a count"},
        {"h2o/b64/wx", "'wx' needs a count"},
        {"h2o/b64x", "'b64x' needs a count"},
        {"h2o/b99999999999", "'b99999999999'"},
        {"h2o/b16/s8/w16", "8 sinks + 16 recent|budget of 16"},
        {"h2o/b64/w16/d1", "query-aware"},
        {"l2-large/b64/d2", "query-aware"},
        {"snapkv/b64", "observation window"},
        {"int4-kivi/h2o", "'h2o' is not known for int4-kivi"},
        {"h2o/b64/int4-kivi", "KIVI"},
        {"l2-large/b64/int8/fp16", "'fp16' is not known for l2-large"},
        /* chapter 06 */
        {"window", "needs its size"},
        {"window/s4", "needs its size"},
        {"window/w0", "needs its size"},
        {"window/w-1", "'w-1' needs a count"},
        {"window/w64/int4", "KIVI"},
        {"window/w64/cache/original", "'original' is not known for window"},
        {"window/w64/int8/fp16", "'fp16' is not known for window"},
        {"window/w64/b16", "'b16' is not known for window"},
        {"window/w16/w32", "'w' is given twice"},
        {"window/s6/s86/s8/s168/w16", "'s' is given twice"},
    };
    for (size_t i = 0; i < sizeof cv / sizeof cv[0]; i++) {
        kv_cache_spec cs;
        kv_err err = {{0}};
        char words[128];
        const int rc = kv_needle_cache_spec(cv[i].variant, 1, 64, &cs, &err);
        KV_CHECK(rc == KV_ERR_UNSUPPORTED, "cache variant '%s': status %d (%s)", cv[i].variant, rc,
                 err.msg);
        snprintf(words, sizeof words, "%s", cv[i].want);
        for (char *w = strtok(words, "|"); w; w = strtok(NULL, "|"))
            KV_CHECK(strstr(err.msg, w) != NULL, "cache variant '%s': message lacks '%s': %s",
                     cv[i].variant, w, err.msg);
    }
    char *longline = malloc(6001); /* longer than either parser's line buffer */
    memset(longline, 'a', 6000);
    longline[6000] = '\0';
    expect_needle_fail(longline, "too long");

    /* request traces */
    struct { const char *row, *want; } tr[] = {
        {"1e300,5,5,1,1,-1", "arrival_s"}, /* overflowed kv_trace_format's buffer */
        {"nan,5,5,1,1,-1", "arrival_s"},   {"-1,5,5,1,1,-1", "arrival_s"},
        {"0,0,5,1,1,-1", "prompt"},        {"0,5,-5,1,1,-1", "output"},
        {"0,5,2000000,1,1,-1", "output"},  {"0,5,5,65,1,-1", "n_samples"},
        {"0,5,5,4,4,-1", "beam"},          {"0,5,5,1,1,7", "prefix"},
        {"0,5,5,1,1", "field"},            {"0,5,5,1,1,-1,9", "field"},
    };
    for (size_t i = 0; i < sizeof tr / sizeof tr[0]; i++) {
        char text[256];
        snprintf(text, sizeof text,
                 "arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id\n%s\n", tr[i].row);
        kv_trace t;
        kv_err err = {{0}};
        int rc = kv_trace_parse(text, &t, &err);
        KV_CHECK(rc == KV_ERR_FORMAT && strstr(err.msg, tr[i].want) != NULL && t.req == NULL,
                 "trace row '%s': status %d, message '%s' (wanted '%s')", tr[i].row, rc, err.msg,
                 tr[i].want);
        if (rc == KV_OK) kv_trace_free(&t);
    }
    /* the seventh column, priority (chapter 07): garbage, out of range, a field too many, a
     * header that declares it over rows without it and the other way round; the message
     * names the line (the header is line 1) */
    struct { const char *head, *rows, *want; } pr[] = {
        {",priority", "0,5,5,1,1,-1,1\n0,5,5,1,1,-1,x\n", "line 3|priority \"x\""},
        {",priority", "0,5,5,1,1,-1,-1\n", "line 2|priority \"-1\""},
        {",priority", "0,5,5,1,1,-1,2\n", "line 2|priority \"2\""},
        {",priority", "0,5,5,1,1,-1,\n", "line 2|priority \"\""},
        {",priority", "0,5,5,1,1,-1,1 \n", "line 2|priority"},
        {",priority", "0,5,5,1,1,-1,99999999999999999999\n", "line 2|priority"},
        {",priority", "0,5,5,1,1,-1,1,3\n", "line 2|8 fields, expected 7"},
        {",priority", "0,5,5,1,1,-1,1\n0,5,5,1,1,-1\n", "line 3|6 fields, expected 7"},
        {"", "0,5,5,1,1,-1,1\n", "line 2|7 fields, expected 6"},
        {",priority,colour", "0,5,5,1,1,-1,1,2\n", "line 1|header"},
        {",priorit", "0,5,5,1,1,-1,1\n", "line 1|header"},
    };
    for (size_t i = 0; i < sizeof pr / sizeof pr[0]; i++) {
        char text[256], words[128];
        snprintf(text, sizeof text,
                 "arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id%s\n%s", pr[i].head,
                 pr[i].rows);
        kv_trace tp;
        kv_err e2 = {{0}};
        int rc = kv_trace_parse(text, &tp, &e2);
        KV_CHECK(rc == KV_ERR_FORMAT && tp.req == NULL, "trace '%s': status %d (%s)", pr[i].rows,
                 rc, e2.msg);
        snprintf(words, sizeof words, "%s", pr[i].want);
        for (char *w = strtok(words, "|"); w; w = strtok(NULL, "|"))
            KV_CHECK(strstr(e2.msg, w) != NULL, "trace '%s': message lacks '%s': %s", pr[i].rows, w,
                     e2.msg);
        if (rc == KV_OK) kv_trace_free(&tp);
    }
    kv_trace t;
    kv_err err = {{0}};
    KV_CHECK(kv_trace_parse("0,5,5,1,1,-1\n", &t, &err) == KV_ERR_FORMAT && strstr(err.msg, "header"),
             "trace without a header: %s", err.msg);

    expect_dialogue_fail("", "no turns");
    expect_dialogue_fail("k0=v1 bogus\n", "unknown item 'bogus'");
    expect_dialogue_fail("k99=v1\n", "k99=v1");
    expect_dialogue_fail("k0=v1\n~0\n", "~0");
    expect_dialogue_fail("k0=v1\n~-3\n", "~-3");
    expect_dialogue_fail("k0=v1\n~99999999999\n", "~99999999999");
    expect_dialogue_fail("k3?\n", "no earlier turn stated");
    expect_dialogue_fail("seed nan\n", "seed N");
    /* absurd total length: 40000 runs of 65536 filler tokens (2.6e9 tokens) overflowed the
     * int sum in kv_dialogue_length(); now the parser refuses the dialogue by its length */
    const int runs_per_line = 500, lines = 80;
    char *huge = malloc((size_t)lines * (runs_per_line * 7 + 1) + 16); /* "~65536 " x runs, "\n" */
    size_t k = (size_t)sprintf(huge, "k0=v1\n");
    for (int i = 0; i < lines; i++) {
        for (int j = 0; j < runs_per_line; j++) k += (size_t)sprintf(huge + k, "~65536 ");
        huge[k++] = '\n';
    }
    huge[k] = '\0';
    expect_dialogue_fail(huge, "longer than");
    free(huge);
    /* more items on a line than the parser holds: refused, not cut silently */
    for (int i = 0; i < 600; i++) memcpy(longline + 3 * i, "f1 ", 3);
    longline[1800] = '\0';
    expect_dialogue_fail(longline, "more than 511 items");
    memset(longline, 'k', 6000);
    expect_dialogue_fail(longline, "line too long");
    free(longline);
}

/* ---- the CLI ----------------------------------------------------------------------------- */


static void test_cli(void)
{
    /* a valid model and tokenizer first: the failures below are the corruption's, not the run's */
    char model[256], tok[256]; /* copies: file() reuses its buffers */
    snprintf(model, sizeof model, "%s", file("good.kvlab"));
    snprintf(tok, sizeof tok, "%s", file("good.tok"));
    result ok = run_in(dir, (const char *const[]){"generate", "--model", model, "--tokenizer", tok,
                                                  "--prompt", "hi", "--steps", "4", NULL});
    KV_CHECK(ok.rc == 0 && ok.out[0] != '\0', "generate on the valid files: exit %d (%s)", ok.rc, ok.err);
    free(ok.out);
    free(ok.err);

    /* checkpoint files */
    CLI_BAD("cut-weights|truncated", "generate", "--model", file("cut-weights"));
    CLI_BAD("trailing|trailing bytes", "generate", "--model", file("trailing"));
    CLI_BAD("magic-ak42|ak42", "generate", "--model", file("magic-ak42"));
    CLI_BAD("weight-nan|NaN", "generate", "--model", file("weight-nan"));
    CLI_BAD("dim-negative|dim (-8)", "generate", "--model", file("dim-negative"));
    CLI_BAD("padding|padding byte", "generate", "--model", file("padding"));
    CLI_BAD("empty", "generate", "--model", file("empty"));
    CLI_BAD("Is a directory", "generate", "--model", dir);
    /* tokenizer files, and a tokenizer that does not fit the model */
    CLI_BAD("tok-score-nan|NaN", "generate", "--model", model, "--tokenizer", file("tok-score-nan"), "--prompt", "x");
    CLI_BAD("tok-len-negative|length -1", "generate", "--model", model, "--tokenizer", file("tok-len-negative"));
    CLI_BAD("tok-cut|truncated", "generate", "--model", model, "--tokenizer", file("tok-cut"));
    CLI_BAD("good.llama2c|outside 0..max_token_length", "generate", "--model", model, "--tokenizer",
            file("good.llama2c"));
    /* needle specs and dialogues; the needle run would write --csv/--svg: refused first */
    write_bytes(file("bad.needle"), "name x\ncolour blue\n", 19);
    write_bytes(file("bad.dlg"), "k0=v1 bogus\n", 12);
    CLI_BAD("bad.needle|unknown field 'colour'", "needle", "--spec", file("bad.needle"), "--csv",
            "out.csv", "--svg", "out.svg", "--save-models", "m");
    CLI_BAD("missing.needle", "needle", "--spec", file("missing.needle"), "--csv", "out.csv");
    CLI_BAD("'5'", "needle", "--lengths", "5", "--csv", "out.csv");
    CLI_BAD("'101'", "needle", "--depths", "50,101", "--svg", "out.svg");
    CLI_BAD("nosuch", "needle", "--cache", "nosuch", "--csv", "out.csv", "--save-models", "m");
    CLI_BAD("bad.dlg|unknown item 'bogus'", "dialogue", file("bad.dlg"));
    CLI_BAD("missing.dlg", "dialogue", file("missing.dlg"));
    /* arguments: absurd, negative, NaN/inf, malformed, unknown, overlong, not UTF-8 */
    CLI_BAD("--steps", "generate", "--steps=");
    CLI_BAD("--steps", "generate", "--steps", "1e3");
    CLI_BAD("--steps", "generate", "--steps", "2147483648");
    /* more steps than the context holds are cut to fit, with a note (as llama2.c's run.c
     * clamps); a prompt that does not fit by itself is refused */
    result cut = run_in(dir, (const char *const[]){"generate", "--model", model, "--steps", "17", NULL});
    KV_CHECK(cut.rc == 0 && strstr(cut.err, "--steps 17 cut to 16") && strstr(cut.err, "seq_len 16"),
             "generate --steps 17 on a seq_len 16 model: exit %d (%s)", cut.rc, cut.err);
    free(cut.out);
    free(cut.err);
    CLI_BAD("--prompt|seq_len 16", "generate", "--model", model, "--tokenizer", tok, "--prompt",
            "one two three four five six seven eight nine ten eleven twelve thirteen");
    CLI_BAD("--temperature", "generate", "--temperature", "inf");
    CLI_BAD("--temperature", "generate", "--temperature", "1e999");
    CLI_BAD("--top-p", "generate", "--top-p", "0");
    CLI_BAD("--seed", "generate", "--seed", "-1");
    CLI_BAD("--chapter", "tour", "--chapter", "0x10");
    CLI_BAD("--chapter", "tour", "--chapter", " 1");
    CLI_BAD("unknown option '--'", "tour", "--=3");
    CLI_BAD("unexpected argument '--'", "tour", "--");
    CLI_BAD("unknown option", "calc", "--\xff\xfe");
    CLI_BAD("--config", "calc", "--config", "64,172,2,4,4,512,512,7");
    CLI_BAD("--config", "calc", "--config", ",,,,,,");
    CLI_BAD("--config|field 7", "calc", "--config",
            "64,172,2,4,4,512,00000000000000000000000000000000000000000000000000000000000000512abc");
    CLI_BAD("--config|must be even", "calc", "--config", "6,6,1,2,1,10,10");
    CLI_BAD("--config", "calc", "--config", "1073741824,1073741824,1024,1,1,16777216,16777216");

    /* chapter 07: kvlab serve's new options, on a valid two-request trace with priorities;
     * --csv/--timeline paths are relative to the (checked-empty) working folder */
    char trace[256], badtrace[256];
    snprintf(trace, sizeof trace, "%s", file("prio.csv"));
    const char *prio = "arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id,priority\n"
                       "0,5,5,1,1,-1,1\n0.1,6,4,1,1,-1,0\n";
    write_bytes(trace, prio, strlen(prio));
    ok = run_in(dir, (const char *const[]){"serve", "--trace", trace, "--preempt", "lru",
                                           "--prefetch", "--csv", "lat.csv", NULL});
    KV_CHECK(ok.rc == 0 && exists(file("lat.csv")), "serve on the valid trace: exit %d (%s)", ok.rc,
             ok.err);
    free(ok.out);
    free(ok.err);
    CLI_BAD("--preempt|'fifo'|recompute", "serve", "--trace", trace, "--preempt", "fifo");
    CLI_BAD("--preempt|''", "serve", "--trace", trace, "--preempt", "");
    CLI_BAD("--preempt|'LRU'", "serve", "--trace", trace, "--preempt", "LRU");
    CLI_BAD("--preempt|missing value", "serve", "--trace", trace, "--preempt");
    CLI_BAD("--prefetch|takes no value", "serve", "--trace", trace, "--preempt", "swap", "--prefetch=1");
    CLI_BAD("--prefetch|--preempt swap or lru", "serve", "--trace", trace, "--prefetch", "--csv", "x.csv");
    CLI_BAD("--host-blocks|--preempt swap or lru", "serve", "--trace", trace, "--host-blocks", "8");
    CLI_BAD("--watermark|out of range", "serve", "--trace", trace, "--watermark", "1");
    CLI_BAD("--watermark|out of range", "serve", "--trace", trace, "--watermark", "1e300");
    CLI_BAD("--watermark|out of range", "serve", "--trace", trace, "--watermark", "-0.01");
    CLI_BAD("--watermark|not a number", "serve", "--trace", trace, "--watermark", "nan");
    CLI_BAD("--watermark|not a number", "serve", "--trace", trace, "--watermark", "5%");
    CLI_BAD("--watermark|'' is not a number", "serve", "--trace", trace, "--watermark", "");
    CLI_BAD("--link-gbps|out of range", "serve", "--trace", trace, "--link-gbps", "0");
    CLI_BAD("--link-gbps|out of range", "serve", "--trace", trace, "--link-gbps", "-25");
    CLI_BAD("--link-gbps|not a number", "serve", "--trace", trace, "--link-gbps", "inf");
    CLI_BAD("--link-gbps|not a number", "serve", "--trace", trace, "--link-gbps", "25GB");
    CLI_BAD("--link-us|out of range", "serve", "--trace", trace, "--link-us", "-1");
    CLI_BAD("--link-us|out of range", "serve", "--trace", trace, "--link-us", "1e8");
    CLI_BAD("--link-us|not a number", "serve", "--trace", trace, "--link-us", "ten");
    CLI_BAD("--token-us|out of range", "serve", "--trace", trace, "--token-us", "-0.5");
    CLI_BAD("--token-us|not a number", "serve", "--trace", trace, "--token-us", "0x10"); /* was 16 */
    CLI_BAD("--link-gbps|not a number", "serve", "--trace", trace, "--link-gbps", "0X1p4");
    CLI_BAD("--token-us|'' is not a number", "serve", "--trace", trace, "--token-us=");
    CLI_BAD("--csv|empty", "serve", "--trace", trace, "--csv", "");
    CLI_BAD("--csv|missing value", "serve", "--trace", trace, "--csv");
    /* an output path that cannot be written: refused before the run (nothing on stdout), and
     * the timeline it had already opened is removed again */
    CLI_BAD("nodir/lat.csv|cannot open", "serve", "--trace", trace, "--csv", "nodir/lat.csv");
    CLI_BAD("nodir/lat.csv|cannot open", "serve", "--trace", trace, "--preempt", "swap",
            "--timeline", "tl.csv", "--csv", "nodir/lat.csv");
    CLI_BAD("nodir/tl.csv|cannot open", "serve", "--trace", trace, "--timeline", "nodir/tl.csv",
            "--csv", "lat.csv");
    CLI_BAD("Is a directory", "serve", "--trace", trace, "--csv", ".");
    /* traces whose priority column is wrong: the message names the file and the line */
    const char *bt[][2] = {
        {"arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id,priority\n0,5,5,1,1,-1,high\n",
         "line 2|priority \"high\""},
        {"arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id,priority\n0,5,5,1,1,-1,1,0\n",
         "line 2|8 fields"},
        {"arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id,priority\n0,5,5,1,1,-1,0\n"
         "1,5,5,1,1,-1\n", "line 3|6 fields, expected 7"},
    };
    for (size_t i = 0; i < sizeof bt / sizeof bt[0]; i++) {
        char name[32], want[160];
        snprintf(name, sizeof name, "badprio%zu.csv", i);
        snprintf(badtrace, sizeof badtrace, "%s", file(name));
        write_bytes(badtrace, bt[i][0], strlen(bt[i][0]));
        snprintf(want, sizeof want, "%s|%s", name, bt[i][1]);
        CLI_BAD(want, "serve", "--trace", badtrace, "--preempt", "lru", "--csv", "lat.csv");
    }

    /* kvlab bench swap: every option is checked before anything is measured */
    CLI_BAD("--model|'nosuch'", "bench", "swap", "--model", "nosuch");
    CLI_BAD("--model|empty", "bench", "swap", "--model", "");
    CLI_BAD("--dtype|'fp8'", "bench", "swap", "--dtype", "fp8");
    CLI_BAD("--dtype|''", "bench", "swap", "--dtype", "");
    CLI_BAD("--dtype|'int4'", "bench", "swap", "--model", "llama-2-7b", "--dtype", "int4");
    CLI_BAD("--min|out of range", "bench", "swap", "--min", "0");
    CLI_BAD("--min|not an integer", "bench", "swap", "--min", "16.5");
    CLI_BAD("--max|out of range", "bench", "swap", "--max", "1048577");
    CLI_BAD("--max|not an integer", "bench", "swap", "--max", "lots");
    CLI_BAD("--min|above --max", "bench", "swap", "--min", "64", "--max", "32");
    CLI_BAD("--block-size|out of range", "bench", "swap", "--block-size", "0");
    CLI_BAD("--measure-max|out of range", "bench", "swap", "--measure-max", "-1");
    CLI_BAD("--repeats|out of range", "bench", "swap", "--repeats", "65");
    CLI_BAD("--link-gbps|out of range", "bench", "swap", "--link-gbps", "0");
    CLI_BAD("--link-gbps|not a number", "bench", "swap", "--link-gbps", "");
    CLI_BAD("--link-us|out of range", "bench", "swap", "--link-us", "-10");
    CLI_BAD("--link-us|not a number", "bench", "swap", "--link-us", "nan");
    CLI_BAD("--gpu-tflops|out of range", "bench", "swap", "--gpu-tflops", "0");
    CLI_BAD("--gpu-tflops|not a number", "bench", "swap", "--gpu-tflops", "inf");
    CLI_BAD("--gpu-tflops|out of range", "bench", "swap", "--gpu-tflops", "1e7");
    CLI_BAD("--csv|missing value|--csv FILE|--csv -", "bench", "swap", "--csv");

    /* kvlab bench attention: the length lists, "none", formats, tiles */
    CLI_BAD("--decode|'0'|out of range", "bench", "attention", "--decode", "0");
    CLI_BAD("--decode|'16777217'|out of range", "bench", "attention", "--decode", "16777217");
    CLI_BAD("--decode|'99999999999999999999'", "bench", "attention", "--decode", "99999999999999999999");
    CLI_BAD("--decode|'-4'", "bench", "attention", "--decode", "1024,-4");
    CLI_BAD("--decode|empty item", "bench", "attention", "--decode", "1024,");
    CLI_BAD("--decode|empty item", "bench", "attention", "--decode", ",1024");
    CLI_BAD("--decode|empty item", "bench", "attention", "--decode", "64,,128");
    CLI_BAD("--decode|' 64'", "bench", "attention", "--decode", "32, 64");
    CLI_BAD("--decode|'1e3'", "bench", "attention", "--decode", "1e3");
    CLI_BAD("--decode|'4k'", "bench", "attention", "--decode", "4k");
    CLI_BAD("--decode|'none'", "bench", "attention", "--decode", "none,64");
    CLI_BAD("--decode|empty", "bench", "attention", "--decode", "");
    CLI_BAD("--decode|more than 16", "bench", "attention", "--decode",
            "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17");
    CLI_BAD("--only|'v9'|not a row", "bench", "attention", "--only", "engine,v9");
    CLI_BAD("--only|''|not a row", "bench", "attention", "--only", "engine,");
    CLI_BAD("--only|the value is empty", "bench", "attention", "--only", "");
    CLI_BAD("--only|'Engine'|not a row", "bench", "attention", "--only", "Engine");
    CLI_BAD("--loops|takes no value", "bench", "attention", "--loops=1");
    CLI_BAD("--prefill|'0'", "bench", "attention", "--prefill", "0");
    CLI_BAD("--prefill|'NONE'", "bench", "attention", "--prefill", "NONE");
    CLI_BAD("--prefill|'16777217'", "bench", "attention", "--decode", "none", "--prefill", "16777217");
    CLI_BAD("--decode|nothing to measure", "bench", "attention", "--decode", "none", "--prefill", "none");
    CLI_BAD("--dtype|'fp64'", "bench", "attention", "--dtype", "fp64");
    CLI_BAD("--dtype|empty", "bench", "attention", "--dtype", "");
    CLI_BAD("--splits|out of range", "bench", "attention", "--splits", "0");
    CLI_BAD("--splits|not an integer", "bench", "attention", "--splits", "many");
    CLI_BAD("--tile-q|out of range", "bench", "attention", "--tile-q", "4097");
    CLI_BAD("--tile-q|not an integer", "bench", "attention", "--tile-q", "");
    CLI_BAD("--tile-k|out of range", "bench", "attention", "--tile-k", "-64");
    CLI_BAD("--device|'tpu'", "bench", "attention", "--device", "tpu");
    CLI_BAD("--kv-heads|does not divide", "bench", "attention", "--heads", "32", "--kv-heads", "6");

    /* kvlab tour: chapters 01 .. 11 have demos; the checks come before any demo runs */
    CLI_BAD("--chapter|no demo for chapter 12", "tour", "--chapter", "12");
    CLI_BAD("--chapter|not an integer", "tour", "--chapter", "7.0");
    CLI_BAD("--chapter|not an integer", "tour", "--chapter", "8,7");
    CLI_BAD("--chapter|not an integer", "tour", "--chapter", "");
    CLI_BAD("--device|'tpu'", "tour", "--chapter", "7", "--device", "tpu");
    CLI_BAD("--weights|need --device cuda", "generate", "--weights", "bf16");
    CLI_BAD("--weights|'int8'", "generate", "--weights", "int8");
    CLI_BAD("--prefill|needs --device cuda", "generate", "--prefill", "mma");
    CLI_BAD("--prefill|'v5'", "generate", "--prefill", "v5");
    CLI_BAD("--device|give --device cuda", "bench", "prefill");
    CLI_BAD("--device|give --device cuda", "bench", "mla");
    CLI_BAD("--csv|missing value|--csv -", "tour", "--chapter", "8", "--csv", "--quick");
    CLI_BAD("--csv|empty", "tour", "--chapter", "8", "--csv=");
    CLI_BAD("unexpected argument '8'", "tour", "--chapter", "7", "8");

    char *huge = malloc(100001);
    memset(huge, '7', 100000);
    huge[100000] = '\0';
    CLI_BAD("--seq|out of range", "calc", "--seq", huge);
    memset(huge, 'x', 100000);
    CLI_BAD("unknown command", huge);
    free(huge);
}

int main(int argc, char **argv)
{
    kv_test_cli_init(argc, argv);
    test_checkpoint();
    test_tokenizer();
    test_datasets();
    test_cli();
    cleanup();
    return kv_test_finish();
}
