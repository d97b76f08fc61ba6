/*
 * The GGUF tokenizers against llama.cpp's ids (label realmodel).
 *
 * llama.cpp's own tokenizer test data: for each vocabulary ggml-vocab-NAME.gguf, the inputs of
 * NAME.gguf.inp (separated by a line "__ggml_vocab_test__") and the ids llama.cpp gives for each
 * in NAME.gguf.out, one line per input, encoded as llama.cpp's test-tokenizer-0 does (no BOS,
 * special tokens as text). Every input must give exactly those ids, and decoding them must give
 * the input back (every input here is valid UTF-8). Run for llama-spm (SentencePiece-style),
 * llama-bpe (Llama 3), gpt-2, and, when fetched with them, qwen2, starcoder, refact, command-r.
 *
 * With the arguments `smollm2 tests/data/smollm2` (test_vocab_smollm2): SmolLM2's tokenizer on
 * the 78 blocks of tokenize.txt, llama.cpp's llama-tokenize ids for 39 inputs with special
 * parsing on and off (tests/data/smollm2/README.md), each decoding back to its input.
 *
 * The files come from `tools/fetch-model.sh llama-vocab` (and `smollm2`) into
 * ${KVLAB_MODELS:-~/.cache/kvlab/models}; without them the test exits 77 (skipped) and says so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_test.h"
#include "kv_gguf.h"
#include "kv_vocab.h"

static const char *const required[] = {"llama-spm", "llama-bpe", "gpt-2"};
static const char *const optional[] = {"qwen2", "starcoder", "refact", "command-r"};

static char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, len = 0, got;
    do {
        if (len + 65536 > cap) {
            cap = 2 * cap + 65536;
            char *b = realloc(buf, cap + 1);
            if (!b) break;
            buf = b;
        }
        got = fread(buf + len, 1, cap - len, f);
        len += got;
    } while (got > 0);
    fclose(f);
    if (buf) buf[len] = '\0';
    *n = len;
    return buf;
}

/* the models folder if it holds ggml-vocab-NAME.gguf, else NULL */
static const char *find_dir(const char *name, char *buf, size_t cap)
{
    const char *env = getenv("KVLAB_MODELS"), *home = getenv("HOME");
    if (env && *env) snprintf(buf, cap, "%s", env);
    else snprintf(buf, cap, "%s/.cache/kvlab/models", home ? home : ".");
    char path[1200];
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", buf, name);
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f ? buf : NULL;
}

/* the tokenizer of a GGUF file, or NULL after a failed check */
static kv_vocab *open_vocab(const char *path)
{
    kv_gguf *g;
    kv_vocab *v = NULL;
    kv_err err;
    int st = kv_gguf_open(path, &g, &err);
    if (!st) {
        st = kv_vocab_from_gguf(g, &v, &err);
        kv_gguf_close(g); /* the vocabulary keeps its own copy */
    }
    KV_CHECK(st == KV_OK, "%s: %s", path, err.msg);
    return v;
}

/* every case of one vocabulary; returns the number of cases run */
static int run_vocab(const char *dir, const char *name)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", dir, name);
    kv_vocab *v = open_vocab(path);
    if (!v) return 0;
    kv_err err;
    int st;
    size_t n_in, n_out;
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.inp", dir, name);
    char *inp = read_all(path, &n_in);
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.out", dir, name);
    char *out = read_all(path, &n_out);
    KV_CHECK(inp && out, "%s: the .inp and .out files", name);
    int cases = 0, failed = 0, cap = 1 << 16;
    int *ids = malloc((size_t)cap * sizeof *ids), *want = malloc((size_t)cap * sizeof *want);
    char *back = malloc(1 << 20);
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t sep_n = strlen(sep), pos = 0;
    char *line = out;
    /* as llama.cpp's test-tokenizer-0 reads them: inputs up to each separator, the rest after
     * the last one (if any) an input too; one output line per input */
    while (inp && out && pos < n_in && ids && want && back) {
        const char *e = strstr(inp + pos, sep);
        size_t len = e ? (size_t)(e - (inp + pos)) : n_in - pos;
        char *nl = strchr(line, '\n');
        KV_CHECK(nl != NULL, "%s: fewer output lines than inputs", name);
        if (!nl) break;
        *nl = '\0';
        int nw = 0;
        for (char *q = line; *q;) {
            char *end;
            long id = strtol(q, &end, 10);
            if (end == q) break;
            if (nw < cap) want[nw++] = (int)id;
            q = end;
        }
        int n = 0;
        st = kv_vocab_encode(v, inp + pos, len, 0, 0, ids, cap, &n, &err);
        int ok = st == KV_OK && n == nw && memcmp(ids, want, (size_t)n * sizeof *ids) == 0;
        size_t at = 0;
        for (int k = 0; ok && k < n && at < (1 << 19); k++)
            at += (size_t)kv_vocab_piece(v, ids[k], back + at, (1 << 20) - (int)at);
        /* a SentencePiece vocabulary put a space in front: its decode starts with it */
        size_t lead = strcmp(name, "llama-spm") == 0 && len > 0;
        int round = ok && at == len + lead && memcmp(back, " ", lead) == 0 &&
                    memcmp(back + lead, inp + pos, len) == 0;
        if ((!ok || !round) && failed++ < 5)
            printf("  %s case %d ('%.*s'): %s\n", name, cases + 1, (int)(len < 60 ? len : 60),
                   inp + pos, ok ? "decodes to other bytes" : "other ids");
        cases++;
        line = nl + 1;
        if (!e) break;
        pos = (size_t)(e - inp) + sep_n;
    }
    KV_CHECK(failed == 0, "%s: %d of %d cases differ from llama.cpp's ids or bytes", name, failed,
             cases);
    KV_CHECK(line && *line == '\0', "%s: more output lines than inputs", name);
    printf("%s: %d cases, %d as llama.cpp\n", name, cases, cases - failed);
    free(ids);
    free(want);
    free(back);
    free(inp);
    free(out);
    kv_vocab_free(v);
    return cases;
}

/* ---- SmolLM2 against llama-tokenize (tests/data/smollm2/tokenize.txt) ---------------- */

/* the README's escaped form: \n \t \r \\ and \xHH; the rest as it is. Returns the length. */
static size_t unescape(const char *s, char *out)
{
    size_t n = 0;
    for (; *s; s++) {
        if (*s != '\\' || !s[1]) {
            out[n++] = *s;
            continue;
        }
        char c = *++s;
        if (c == 'n') out[n++] = '\n';
        else if (c == 't') out[n++] = '\t';
        else if (c == 'r') out[n++] = '\r';
        else if (c == 'x' && s[1] && s[2]) {
            char hex[3] = {s[1], s[2], 0};
            out[n++] = (char)strtol(hex, NULL, 16);
            s += 2;
        } else out[n++] = c; /* \\ */
    }
    return n;
}

/* every block: input, flags, ids; each must give llama-tokenize's ids and decode back */
static int run_smollm2(const char *model, const char *data)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/tokenize.txt", data);
    size_t n_file;
    char *file = read_all(path, &n_file);
    KV_CHECK(file != NULL, "%s: cannot read", path);
    kv_vocab *v = open_vocab(model);
    if (!file || !v) return free(file), kv_vocab_free(v), 0;
    kv_err err;
    int st;
    KV_CHECK(kv_vocab_bos(v) == 1 && kv_vocab_eos(v) == 2 && kv_vocab_find(v, "<|im_start|>") == 1 &&
             kv_vocab_find(v, "<|im_end|>") == 2 && kv_vocab_find(v, "<|endoftext|>") == 0,
             "SmolLM2's special ids (README: bos 1, eos 2, <|endoftext|> 0)");
    static char text[1 << 16], back[1 << 18];
    static int ids[1 << 14], want[1 << 14];
    size_t len = 0;
    int blocks = 0, failed = 0, special = -1, add_bos = -1;
    for (char *line = strtok(file, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "input:", 6) == 0) {
            len = unescape(line + 6, text);
        } else if (strncmp(line, "flags:", 6) == 0) {
            KV_CHECK(sscanf(line, "flags: special=%d add_bos=%d", &special, &add_bos) == 2,
                     "flags line '%s'", line);
        } else if (strncmp(line, "ids:", 4) == 0) {
            char *q = line + 4, *end;
            long count = strtol(q, &end, 10);
            int nw = 0;
            for (q = end; nw < (1 << 14); q = end) {
                long id = strtol(q, &end, 10);
                if (end == q) break;
                want[nw++] = (int)id;
            }
            KV_CHECK(count == nw, "block %d: %ld ids announced, %d given", blocks + 1, count, nw);
            int n = 0;
            st = kv_vocab_encode(v, text, len, add_bos, special, ids, 1 << 14, &n, &err);
            int ok = st == KV_OK && n == nw && memcmp(ids, want, (size_t)n * sizeof *ids) == 0;
            size_t at = 0;
            for (int k = 0; ok && k < n && at < sizeof back / 2; k++)
                at += (size_t)kv_vocab_piece(v, ids[k], back + at, (int)(sizeof back - at));
            int round = ok && at == len && memcmp(back, text, len) == 0;
            if ((!ok || !round) && failed++ < 5)
                printf("  block %d (special=%d, '%.*s'): %s\n", blocks + 1, special,
                       (int)(len < 60 ? len : 60), text, ok ? "decodes to other bytes" : "other ids");
            blocks++;
        }
    }
    KV_CHECK(blocks >= 60, "tokenize.txt: %d blocks", blocks);
    KV_CHECK(failed == 0, "SmolLM2: %d of %d blocks differ from llama-tokenize", failed, blocks);
    printf("SmolLM2: %d blocks, %d as llama-tokenize\n", blocks, blocks - failed);
    free(file);
    kv_vocab_free(v);
    return blocks;
}

/* usage: test_vocab_gguf                      llama.cpp's test vocabularies
 *        test_vocab_gguf smollm2 DATA_FOLDER  SmolLM2 against tests/data/smollm2/tokenize.txt */
int main(int argc, char **argv)
{
    char dir[1100];
    if (argc >= 3 && strcmp(argv[1], "smollm2") == 0) {
        char model[1200];
        const char *file = "SmolLM2-135M-Instruct.Q4_1.gguf";
        const char *env = getenv("KVLAB_MODELS"), *home = getenv("HOME");
        if (env && *env) snprintf(model, sizeof model, "%s/%s", env, file);
        else snprintf(model, sizeof model, "%s/.cache/kvlab/models/%s", home ? home : ".", file);
        FILE *f = fopen(model, "rb");
        if (!f) {
            printf("%s not found: tools/fetch-model.sh smollm2\n", model);
            return KV_TEST_SKIP;
        }
        fclose(f);
        run_smollm2(model, argv[2]);
        return kv_test_finish();
    }
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        if (!find_dir(required[i], dir, sizeof dir)) {
            printf("ggml-vocab-%s.gguf not found: tools/fetch-model.sh llama-vocab\n", required[i]);
            return KV_TEST_SKIP;
        }
    }
    int total = 0;
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        total += run_vocab(find_dir(required[i], dir, sizeof dir), required[i]);
    for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++)
        if (find_dir(optional[i], dir, sizeof dir)) total += run_vocab(dir, optional[i]);
    printf("%d cases in all\n", total);
    return kv_test_finish();
}
