/*
 * Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/: small valid
 * inputs (and a few near-misses) that give libFuzzer a start inside each format. The files
 * are committed; rerun this after a format changes:
 *
 *   cmake --preset fuzz -B build-fuzz && cmake --build build-fuzz --target fuzz_make_seeds
 *   ./build-fuzz/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus
 *
 * The needle, dialogue and trace targets also start from datasets/needle, datasets/dialogues
 * and datasets/traces.
 */
#define _POSIX_C_SOURCE 200809L
#include "kv_checkpoint.h"
#include "kv_tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *root;

static void die(const char *what)
{
    fprintf(stderr, "make_seeds: %s\n", what);
    exit(1);
}

static const char *path_of(const char *target, const char *name)
{
    static char p[4096];
    snprintf(p, sizeof p, "%s/%s", root, target);
    if (mkdir(p, 0755) != 0 && errno != EEXIST) die(p);
    snprintf(p, sizeof p, "%s/%s/%s", root, target, name);
    return p;
}

static void put(const char *target, const char *name, const void *data, size_t n)
{
    FILE *f = fopen(path_of(target, name), "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) die(name);
}

/* ---- checkpoints: a 4-wide model (d 2, H 2, H_kv 1) in both formats -------------------- */

/* a model of config c with seed-7 weights, written in format */
static void write_model(const char *name, const kv_config *c, int format)
{
    kv_model m;
    kv_err err;
    if (kv_model_alloc(&m, c, &err)) die(err.msg);
    kv_model_randomize(&m, 7);
    if (kv_checkpoint_write(path_of("checkpoint", name), &m, format, &err)) die(err.msg);
    kv_model_free(&m);
}

static void checkpoint(const char *name, int format, int tied, int n_kv_heads, float theta)
{
    kv_config c = {4, 4, 1, 2, n_kv_heads, 4, 3, 0, 0, 0, 0, 0, 0, {0}};
    kv_config_set_defaults(&c);
    c.tied_classifier = tied;
    c.rope_theta = theta;
    write_model(name, &c, format);
}

/* ---- checkpoints: an MLA model (kvlab header v2), 4 wide, 2 layers so a prefix is a part ---- */

static void checkpoint_mla(const char *name, int q_rank, int tied)
{
    kv_config c = {4, 4, 2, 2, 1, 4, 3, 0, 0, 0, 0, 0, 0, {0}};
    kv_config_set_defaults(&c); /* then the MLA fields, which it clears */
    c.attn = KV_ATTN_MLA;
    c.mla = (kv_mla_dims){2, 2, 2, 2, q_rank}; /* d_c, d_R, d_nope, d_v, q_rank */
    c.rotary_dim = c.mla.d_rope; /* only q_R and k_R rotate */
    c.tied_classifier = tied;
    write_model(name, &c, KV_FILE_KVLAB);
}

/* ---- tokenizer: [u16 vocab-1][u8 prompt length][prompt][tokenizer.bin] -------------------- */

typedef struct {
    unsigned char *b;
    size_t n, cap;
} buf;

static void add(buf *x, const void *p, size_t n)
{
    if (x->n + n > x->cap) {
        x->cap = (x->n + n) * 2;
        x->b = realloc(x->b, x->cap);
        if (!x->b) die("out of memory");
    }
    memcpy(x->b + x->n, p, n);
    x->n += n;
}

static void tok_header(buf *x, int vocab, const char *prompt)
{
    unsigned v = (unsigned)(vocab - 1);
    unsigned char h[3] = {(unsigned char)(v & 255), (unsigned char)(v >> 8), (unsigned char)strlen(prompt)};
    add(x, h, 3);
    add(x, prompt, strlen(prompt));
}

static void tok_entry(buf *x, const char *s, float score)
{
    int32_t len = (int32_t)strlen(s);
    add(x, &score, 4);
    add(x, &len, 4);
    add(x, s, (size_t)len);
}

static void tokenizers(void)
{
    /* a hand-made vocabulary of 8 tokens with merges and no byte fallback */
    buf x = {0};
    static const char *hand[8] = {"<unk>", "<s>", "</s>", " ", "a", "b", "ab", " ab"};
    tok_header(&x, 8, "abab ba");
    int32_t max_len = 5;
    add(&x, &max_len, 4);
    for (int i = 0; i < 8; i++) tok_entry(&x, hand[i], i >= 6 ? (float)i : 0.0f);
    put("tokenizer", "hand8", x.b, x.n);

    /* the embedded byte tokenizer, 259 and 300 tokens, as files */
    const int sizes[2] = {259, 300};
    const char *names[2] = {"bytes259", "bytes300"};
    for (int k = 0; k < 2; k++) {
        kv_tokenizer t;
        kv_err err;
        if (kv_tokenizer_bytes(&t, sizes[k], &err)) die(err.msg);
        x.n = 0;
        tok_header(&x, sizes[k], "hi \xc3\xa9!");
        int32_t ml = t.max_token_length;
        add(&x, &ml, 4);
        for (int i = 0; i < t.vocab_size; i++) {
            int32_t len = t.lengths[i];
            add(&x, &t.scores[i], 4);
            add(&x, &len, 4);
            add(&x, t.vocab[i], (size_t)len);
        }
        put("tokenizer", names[k], x.b, x.n);
        kv_tokenizer_free(&t);
    }
    /* near-misses: truncated after the header, and a negative token length */
    x.n = 0;
    tok_header(&x, 8, "a");
    add(&x, &max_len, 4);
    put("tokenizer", "truncated", x.b, x.n);
    int32_t neg = -1;
    float zero = 0.0f;
    add(&x, &zero, 4);
    add(&x, &neg, 4);
    put("tokenizer", "negative-length", x.b, x.n);
    free(x.b);
}

/* ---- encode: [u8 vocab choice][text] ---------------------------------------------------- */

static void encode_seeds(void)
{
    static const char *texts[] = {
        "Hello world", "the thing that they then", "\xe2\x82\xac 5 \xf0\x9f\x98\x80 ok",
        "\xff\xfe\x80 broken utf-8 \xc3", "<0x41><s></s><unk>", "   spaces   ", "a",
    };
    for (int i = 0; i < (int)(sizeof texts / sizeof texts[0]); i++) {
        char name[32], data[128];
        data[0] = (char)i; /* vocab choice i & 3 */
        size_t n = strlen(texts[i]);
        memcpy(data + 1, texts[i], n);
        snprintf(name, sizeof name, "text%d", i);
        put("encode", name, data, n + 1);
    }
}

/* ---- vocab: [u8 flags: 1 SentencePiece, 2 special, 4 BOS][text, any bytes] --------------- */

#define SEED(flags, text) {flags, text, sizeof text - 1}

static void vocab_seeds(void)
{
    static const struct {
        int flags;
        const char *text;
        size_t n;
    } seeds[] = { /* the text's bytes, NULs included */
        SEED(0, "Hello world 12 the"),
        SEED(2, "<|im_start|>user\nHi<|im_end|>\n"),
        SEED(0, "\xe2\x82\xac 5 \xf0\x9f\x98\x80 \xe6\x97\xa5\xe6\x9c\xac"),
        SEED(0, "\xff\xfe\x80 broken \xc3 \xc0\x80 \xed\xa0\x80 \xf5\x80\x80\x80"),
        SEED(0, "a\0b  \t\r\n\n  x"),
        SEED(5, "Hello the world \xc3\xa9"),
        SEED(1, "\xe2\x96\x81 \xe2 x"),
        SEED(4, ""),
    };
    for (int i = 0; i < (int)(sizeof seeds / sizeof seeds[0]); i++) {
        char name[32], data[64];
        data[0] = (char)seeds[i].flags;
        memcpy(data + 1, seeds[i].text, seeds[i].n);
        snprintf(name, sizeof name, "text%d", i);
        put("vocab", name, data, seeds[i].n + 1);
    }
}

/* ---- args: [u8 mode][word\0word\0...] ---------------------------------------------------- */

static void args_seed(const char *name, int mode, const char *const *words)
{
    char data[512];
    size_t n = 0;
    data[n++] = (char)mode;
    for (int i = 0; words[i]; i++) {
        size_t l = strlen(words[i]) + 1;
        memcpy(data + n, words[i], l);
        n += l;
    }
    put("args", name, data, n);
}

static void args_seeds(void)
{
    args_seed("table-ok", 0, (const char *const[]){"--flag", "--n", "12", "--big=900", "--x", "-0.25",
                                                   "--s", "word", "--c=blue", NULL});
    args_seed("table-bad", 0, (const char *const[]){"--n", "12abc", NULL});
    args_seed("table-help", 0, (const char *const[]){"--x", "1e-3", "--help", NULL});
    args_seed("table-missing", 0, (const char *const[]){"--s", "--flag", NULL});
    args_seed("calc-preset", 1, (const char *const[]){"--preset", "llama-2-7b", "--dtype", "int4",
                                                      "--seq", "2048", "--batch", "8", NULL});
    args_seed("calc-config", 1, (const char *const[]){"--config", "288,768,6,6,6,32000,256", NULL});
    args_seed("calc-config-bad", 1, (const char *const[]){"--config=64,172,2,4,3,512,51x", NULL});
    args_seed("calc-table", 1, (const char *const[]){"--dtype", "fp8", "--seq=100", NULL});
    args_seed("calc-list", 1, (const char *const[]){"--list", NULL});
    /* chapter 07/08 options (serve, bench swap, bench attention, tour): their value shapes
     * through the same table: hex floats, 0 and 1 at range ends, empty values, lists */
    args_seed("serve-watermark", 0,
              (const char *const[]){"--x", "0.99", "--x", "1", "--flag", NULL});
    args_seed("serve-hexfloat", 0,
              (const char *const[]){"--x", "0x1p-1", "--big", "0x10", "--x", "0X1", NULL});
    args_seed("serve-link-zero", 0,
              (const char *const[]){"--x", "0", "--x", "-0", "--x", "1e-6", "--x", "1e300", NULL});
    args_seed("serve-preempt-choice", 0,
              (const char *const[]){"--c", "lru", "--c", "", "--c=blue", "--c", NULL});
    args_seed("serve-prefetch-value", 0,
              (const char *const[]){"--flag=1", "--flag", "--s", "nodir/lat.csv", NULL});
    args_seed("serve-csv-empty", 0, (const char *const[]){"--s", "", "--s=", NULL});
    args_seed("swap-min-max", 0,
              (const char *const[]){"--n", "0", "--n", "1048577", "--big", "16.5", "--n", "+16", NULL});
    args_seed("swap-gpu-tflops", 0,
              (const char *const[]){"--x", "inf", "--x", "nan", "--x", ".5", "--x", "5.", NULL});
    args_seed("attn-lengths", 0,
              (const char *const[]){"--s", "1024,4096,16384,65536", "--s", "none", "--n", "16777217", NULL});
    args_seed("attn-lengths-bad", 0,
              (const char *const[]){"--s", "64,,128", "--n", "1024,", "--n", " 64", "--n", "4k", NULL});
    args_seed("tour-chapter", 0,
              (const char *const[]){"--n", "7", "--n", "8", "--n", "7.0", "--n", "8,7", "--flag=0", NULL});
}

/* ---- needle / dialogue: edge cases beside the datasets' real files ---------------------- */

static void text_seeds(void)
{
    const char *needle = "name edge # comment\nmodels induction\nlengths 16 17\ndepths 100 0\n"
                         "variant fp32 within:5\nvariant exact any\nseeds 3\nmodel-seed 0\n";
    put("needle", "edge", needle, strlen(needle));
    const char *dlg = "seed 5\nk0=v15 f3 ~2\n~1 k0?\nk15=v0\nf63 k15?\n";
    put("dialogue", "edge", dlg, strlen(dlg));
    const char *trace = "# two prefixes, every kind of request\n#prefix,0,8\n#prefix,3,20\n"
                        "arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id\n"
                        "0,9,1,1,1,0\n0,1,5,4,1,-1\n0.5,21,2,1,64,3\n1.5,30,1048576,1,1,-1\r\n";
    put("trace", "edge", trace, strlen(trace));
}

/* ---- sampler: vocab, temperature, top-p, logit shape, seed, logits (fuzz_sampler.c) ------ */

static void sampler_seeds(void)
{
    static const char *names[8] = {"raw", "flat-top-p-tiny", "ties", "nan", "inf", "all-minus-inf",
                                   "one-dominant", "finite-denormal-t"};
    for (int shape = 0; shape < 8; shape++) {
        unsigned char b[12 + 4 * 8] = {0};
        b[0] = shape == 1 ? 63 : 7;                /* vocab 64 or 8 */
        b[1] = shape == 7 ? 1 : (unsigned char)(5 + shape % 3); /* T 1e-40, or 1, 2, 100 */
        b[2] = shape == 1 ? 2 : (unsigned char)(5 + shape % 2); /* top-p 1e-3, or 0.9, 0.999999 */
        b[3] = (unsigned char)shape;
        b[4] = (unsigned char)(17 + shape);        /* seed */
        for (int i = 0; i < 8; i++) {
            float v = (float)(i * i % 5) - 1.5f;
            memcpy(b + 12 + 4 * i, &v, 4);
        }
        put("sampler", names[shape], b, sizeof b);
    }
}

/* ---- cache specs: [variant][\0 prediction rule] (fuzz_cache_spec.c) ---------------------- */

static void cache_spec_seed(const char *variant, const char *rule)
{
    char data[256], name[128];
    size_t n = strlen(variant);
    memcpy(data, variant, n);
    if (rule) {
        data[n++] = '\0';
        memcpy(data + n, rule, strlen(rule));
        n += strlen(rule);
    }
    /* the file name: the variant with / : and space as _ (and the rule after @) */
    snprintf(name, sizeof name, "%s%s%s", variant[0] ? variant : "empty", rule ? "@" : "",
             rule ? rule : "");
    for (char *c = name; *c; c++)
        if (*c == '/' || *c == ':' || *c == ' ') *c = '_';
    put("cache_spec", name, data, n);
}

static void cache_spec_seeds(void)
{
    /* every variant the project uses: --cache defaults, chapter 04 formats and options, the
     * needle grids (datasets/needle), chapter 09's table (ch09_variants) */
    static const char *const used[] = {
        "fp32", "exact", "fp16", "bf16", "int8", "int8-g32", "int8-g64", "int8-g128", "fp8",
        "fp8-e4m3", "fp8-e5m2", "fp8-e4m3/head", "fp8-e5m2/head", "int4", "int2", "int4-kivi",
        "int2-kivi", "int4/w32", "int4/w64/l1,3", "int4/w32/l0", "int2/w32", "int4/l0,1",
        "int8/l1",
        "l2-large/b16/w4", "l2-large/b32/w8", "l2-large/b64/w16", "l2-small/b32/w8",
        "l2-small/b64/w16", "l2-small/b64/s4/w16", "l2-small/b128/w32", "h2o/b32/w8",
        "h2o/b64/w16", "h2o/b64/w16/int8", "h2o/r0.1/w16", "h2o/b16/s8/w16", "snapkv/b32/w8",
        "snapkv/b64/w16", "snapkv/b128/w16", "snapkv/r0.25/w8/s4", "quest/b16", "quest/b32",
        "quest/b64", "quest/b32/d2", "quest/b64/d2", "quest/b64/int4", "topk/b16", "topk/b64",
        "h2o/b128/w16/int8",
        /* parsed, then refused by kv_cache_spec_check for a 2-layer model of d 64 */
        "int8/l0,63", "fp8-e4m3/head/l0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16", NULL};
    /* near misses, all refused: empty layer lists and items, signs, bad ratios and budgets,
     * options of the wrong family, two formats, KIVI under a method, too long */
    static const char *const refused[] = {
        "", "/", "none", "int8/l", "int8/l0,", "int8/l0,,1", "int8/l64", "int8/l,0", "w+32",
        "int4/w+32", "int4/w48", "int4/w0", "int8/head", "int8/w32", "h2o/b64/w+32", "h2o/b+64",
        "h2o/b0", "h2o/r0", "h2o/r1.01", "h2o/rnan", "h2o/r0x1p-1", "h2o/r 0.5", "h2o/w16",
        "h2o/b64/r0.5", "h2o/b8/w16", "h2o/b64/w16/d1", "h2o/b64/int8/fp16", "h2o/b64x",
        "h2o/b99999999999", "snapkv/b64", "int4-kivi/h2o", "quest/b64/int4-kivi", "nosuch/b64",
        "int8-g32/int8", "fp8-e4m3/head/l0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20",
        NULL};
    for (int i = 0; used[i]; i++) cache_spec_seed(used[i], NULL);
    for (int i = 0; refused[i]; i++) cache_spec_seed(refused[i], NULL);
    /* predictions (needle grid `variant SPEC RULE` lines) */
    cache_spec_seed("fp32", "within:5");
    cache_spec_seed("h2o/b64/w16", "kept:100,16");
    cache_spec_seed("topk/b16", "atleast:3,4");
    cache_spec_seed("quest/b16", "page-split:16");
    cache_spec_seed("h2o/r0.1/w16", "from:40");
    cache_spec_seed("int8", "none");
    cache_spec_seed("fp8", "kept:1,");
    cache_spec_seed("int2", "within:+5");
}

/* ---- GGUF: small files by hand (tests/data/gguf/ adds the gguf package's) -------------- */

static void u32(buf *x, uint32_t v) { add(x, &v, 4); }
static void u64(buf *x, uint64_t v) { add(x, &v, 8); }
static void gstr(buf *x, const char *s) { u64(x, strlen(s)); add(x, s, strlen(s)); }

static void gguf_seeds(void)
{
    buf x = {0};
    add(&x, "GGUF", 4); /* version 3, no tensors, no keys */
    u32(&x, 3);
    u64(&x, 0);
    u64(&x, 0);
    put("gguf", "empty-v3", x.b, x.n);
    x.n = 0; /* version 2: an alignment, a string array, an array of arrays, one F32 tensor */
    add(&x, "GGUF", 4);
    u32(&x, 2);
    u64(&x, 1);
    u64(&x, 3);
    gstr(&x, "general.alignment");
    u32(&x, 4); /* u32 */
    u32(&x, 64);
    gstr(&x, "tokenizer.ggml.tokens");
    u32(&x, 9); /* array */
    u32(&x, 8); /* of strings */
    u64(&x, 2);
    gstr(&x, "a");
    gstr(&x, "<s>");
    gstr(&x, "nested");
    u32(&x, 9);
    u32(&x, 9); /* of arrays */
    u64(&x, 1);
    u32(&x, 5); /* of i32 */
    u64(&x, 2);
    u32(&x, 7);
    u32(&x, 8);
    gstr(&x, "w");
    u32(&x, 1); /* n_dims */
    u64(&x, 4);
    u32(&x, 0); /* F32 */
    u64(&x, 0); /* offset */
    while (x.n % 64) add(&x, "", 1);
    const float w[4] = {1, -2, 0.5f, 3};
    add(&x, w, sizeof w);
    put("gguf", "one-tensor-align64-v2", x.b, x.n);
    free(x.b);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <corpus folder>\n", argv[0]);
        return 2;
    }
    root = argv[1];
    if (mkdir(root, 0755) != 0 && errno != EEXIST) die(root);
    checkpoint("kvlab-tied", KV_FILE_KVLAB, 1, 1, 500000.0f);
    checkpoint("kvlab-untied-mha", KV_FILE_KVLAB, 0, 2, 10000.0f);
    checkpoint("llama2c-tied", KV_FILE_LLAMA2C, 1, 1, 10000.0f);
    checkpoint("llama2c-untied", KV_FILE_LLAMA2C, 0, 2, 10000.0f);
    checkpoint_mla("kvlab-v2-mla", 0, 1);
    checkpoint_mla("kvlab-v2-mla-qrank-untied", 2, 0);
    tokenizers();
    encode_seeds();
    vocab_seeds();
    args_seeds();
    text_seeds();
    sampler_seeds();
    cache_spec_seeds();
    gguf_seeds();
    return 0;
}
