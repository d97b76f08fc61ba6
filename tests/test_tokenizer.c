/*
 * Tokenizer: the embedded byte vocabulary, tokenizer.bin round trips, encode/decode against
 * hand-computed merges and against a plain rewrite of llama2.c's quadratic merge loop, and
 * bad files failing with the token index named.
 */
#define _GNU_SOURCE
#include "kv_tokenizer.h"
#include "kv_rng.h"
#include "common/kv_test.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];
static char path[256];

static const char *file(const char *name)
{
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

/* ------------------------------------------------------------------------------------
 * Writing tokenizer.bin by hand (llama2.c's tokenizer.py export layout)
 */
typedef struct {
    const char *s;
    int len; /* -1: strlen(s) */
    float score;
} tok;

static FILE *open_tok(const char *p, int32_t max_len)
{
    FILE *f = fopen(p, "wb");
    fwrite(&max_len, 4, 1, f);
    return f;
}

static void put_tok(FILE *f, const char *s, int32_t len, float score)
{
    fwrite(&score, 4, 1, f);
    fwrite(&len, 4, 1, f);
    if (len > 0) fwrite(s, 1, (size_t)len, f);
}

/* the llama2.c-style prefix: <unk>, <s>, </s>, <0x00>..<0xFF> (259 tokens) */
static void put_prefix(FILE *f)
{
    put_tok(f, "<unk>", 5, 0.0f);
    put_tok(f, "\n<s>\n", 5, 0.0f);
    put_tok(f, "\n</s>\n", 6, 0.0f);
    char b[8];
    for (int i = 0; i < 256; i++) {
        snprintf(b, sizeof b, "<0x%02X>", i);
        put_tok(f, b, 6, 0.0f);
    }
}

/* a small hand vocabulary; ids 259.. as listed */
static const tok hand[] = {
    {" ", -1, 0.0f},     /* 259 */
    {"a", -1, 0.0f},     /* 260 */
    {"b", -1, 0.0f},     /* 261 */
    {"c", -1, 0.0f},     /* 262 */
    {"ab", -1, -1.0f},   /* 263 */
    {"bc", -1, -0.5f},   /* 264 */
    {" a", -1, -2.0f},   /* 265 */
    {"abc", -1, -3.0f},  /* 266 */
    {" abc", -1, -4.0f}, /* 267 */
    {"\xc3\xa9", -1, 0.0f}, /* 268 "é" */
    {"aa", -1, -1.0f},   /* 269 */
    {"x\0y", 3, -9.0f},  /* 270: a token with a NUL byte inside */
};
#define HAND_N (259 + (int)(sizeof hand / sizeof hand[0]))

static void write_hand(const char *p)
{
    FILE *f = open_tok(p, 6);
    put_prefix(f);
    for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++)
        put_tok(f, hand[i].s, hand[i].len < 0 ? (int32_t)strlen(hand[i].s) : hand[i].len,
                hand[i].score);
    fclose(f);
}

/* ------------------------------------------------------------------------------------
 * llama2.c's encode loop, rewritten plainly: linear lookup, rescan after every merge.
 * The library must produce exactly the same tokens.
 */
static int ref_lookup(const kv_tokenizer *t, const char *s, int len)
{
    for (int i = 0; i < t->vocab_size; i++)
        if (t->lengths[i] == len && memcmp(t->vocab[i], s, (size_t)len) == 0) return i;
    return -1;
}

static int ref_encode(const kv_tokenizer *t, const char *text, int bos, int eos, int *out)
{
    int n = 0;
    if (bos) out[n++] = 1;
    if (text[0]) {
        int sp = ref_lookup(t, " ", 1);
        out[n++] = sp >= 0 ? sp : 3 + ' ';
    }
    for (const unsigned char *c = (const unsigned char *)text; *c;) {
        int len = 1;
        while (len < 4 && (c[len] & 0xC0) == 0x80) len++;
        int id = ref_lookup(t, (const char *)c, len);
        if (id >= 0) out[n++] = id;
        else for (int i = 0; i < len; i++) out[n++] = 3 + c[i];
        c += len;
    }
    char buf[256];
    for (;;) {
        float best = 0;
        int best_i = -1, best_id = -1;
        for (int i = 0; i + 1 < n; i++) {
            int la = t->lengths[out[i]], lb = t->lengths[out[i + 1]];
            if (la + lb > (int)sizeof buf) continue;
            memcpy(buf, t->vocab[out[i]], (size_t)la);
            memcpy(buf + la, t->vocab[out[i + 1]], (size_t)lb);
            int id = ref_lookup(t, buf, la + lb);
            if (id < 259) continue; /* never merge into special or byte tokens */
            if (best_i < 0 || t->scores[id] > best) {
                best = t->scores[id];
                best_i = i;
                best_id = id;
            }
        }
        if (best_i < 0) break;
        out[best_i] = best_id;
        memmove(out + best_i + 1, out + best_i + 2, sizeof(int) * (size_t)(n - best_i - 2));
        n--;
    }
    if (eos) out[n++] = 2;
    return n;
}

/* encode, then decode token by token; the concatenation must give text back */
static void check_round_trip(const kv_tokenizer *t, const char *text, const char *what)
{
    size_t len = strlen(text);
    int *ids = malloc(sizeof(int) * (len + 3));
    int n = 0;
    kv_err err = {{0}};
    int rc = kv_tokenizer_encode(t, text, 1, 0, ids, &n, &err);
    KV_CHECK(rc == KV_OK, "%s: encode failed: %s", what, err.msg);
    char *back = malloc(len + 64 * (size_t)n + 1);
    size_t k = 0;
    char bb[2];
    for (int i = 1; i < n; i++) {
        const char *piece = kv_tokenizer_decode(t, ids[i - 1], ids[i], bb);
        size_t pl = (piece == bb) ? 1 : strlen(piece); /* a decoded byte may be 0x00 */
        memcpy(back + k, piece, pl);
        k += pl;
    }
    KV_CHECK(k == len && memcmp(back, text, len) == 0, "%s: decoded '%.*s', want '%s'", what,
             (int)k, back, text);
    /* and the fast merge agrees with the plain llama2.c loop */
    int *ref = malloc(sizeof(int) * (len + 3));
    int nr = ref_encode(t, text, 1, 0, ref);
    KV_CHECK(nr == n && memcmp(ref, ids, sizeof(int) * (size_t)n) == 0,
             "%s: %d tokens, the llama2.c loop gives %d (or different ids)", what, n, nr);
    free(ref);
    free(back);
    free(ids);
}

/* ------------------------------------------------------------------------------------ */

static void test_embedded(void)
{
    kv_tokenizer t;
    kv_err err = {{0}};
    KV_CHECK(kv_tokenizer_bytes(&t, 512, &err) == KV_OK, "bytes(512): %s", err.msg);
    KV_CHECK(t.vocab_size == 512 && t.byte_base == 3 && t.max_token_length == 6,
             "vocab %d byte_base %d max_len %d", t.vocab_size, t.byte_base, t.max_token_length);
    KV_CHECK(strcmp(t.vocab[0], "<unk>") == 0 && strcmp(t.vocab[1], "\n<s>\n") == 0 &&
                 strcmp(t.vocab[2], "\n</s>\n") == 0, "special tokens");
    KV_CHECK(strcmp(t.vocab[3], "<0x00>") == 0 && strcmp(t.vocab[3 + 0x41], "<0x41>") == 0 &&
                 strcmp(t.vocab[258], "<0xFF>") == 0, "byte tokens");
    KV_CHECK(strcmp(t.vocab[259], " ") == 0 && strcmp(t.vocab[353], "~") == 0, "printable singles");
    KV_CHECK(strcmp(t.vocab[354], " t") == 0 && t.scores[354] == 0.0f && t.scores[355] == -1.0f,
             "first merged pair '%s' %g", t.vocab[354], (double)t.scores[354]);
    int distinct = 1; /* no string twice */
    for (int i = 0; i < t.vocab_size && distinct; i++)
        for (int j = i + 1; j < t.vocab_size; j++)
            if (t.lengths[i] == t.lengths[j] && memcmp(t.vocab[i], t.vocab[j], (size_t)t.lengths[i]) == 0) {
                distinct = 0;
                printf("  duplicate tokens %d and %d\n", i, j);
                break;
            }
    KV_CHECK(distinct, "embedded vocabulary has duplicates");

    /* a known encoding: " t" (rank 0) beats "th" (rank 2); "he" then merges the rest */
    int ids[16], n = 0;
    KV_CHECK(kv_tokenizer_encode(&t, "the", 1, 1, ids, &n, &err) == KV_OK, "encode the");
    int want[] = {1, 354, 357, 2}; /* <s> " t" "he" </s> */
    KV_CHECK(n == 4 && memcmp(ids, want, sizeof want) == 0, "'the' -> %d tokens [%d %d %d %d]", n,
             ids[0], ids[1], ids[2], ids[3]);
    KV_CHECK(kv_tokenizer_encode(&t, "", 1, 1, ids, &n, &err) == KV_OK && n == 2 && ids[0] == 1 &&
                 ids[1] == 2, "empty text -> BOS EOS only");
    KV_CHECK(kv_tokenizer_encode(&t, "", 0, 0, ids, &n, &err) == KV_OK && n == 0, "empty text");

    check_round_trip(&t, "Hello world, the cat sat on the mat.", "ascii");
    check_round_trip(&t, " leading space and  two  spaces", "spaces");
    check_round_trip(&t, "tabs\tand\nnewlines\r\n", "control bytes");
    check_round_trip(&t, "na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac "
                         "\xf0\x9f\x99\x82", "utf-8 via byte fallback");
    check_round_trip(&t, "<0x41> <s> <unk>", "text spelling special tokens");
    check_round_trip(&t, "\xff\xfe broken \xc3 utf-8 \x80", "malformed utf-8");

    /* UTF-8 outside the vocabulary becomes byte tokens */
    KV_CHECK(kv_tokenizer_encode(&t, "\xc3\xa9", 0, 0, ids, &n, &err) == KV_OK && n == 3 &&
                 ids[0] == 259 && ids[1] == 3 + 0xC3 && ids[2] == 3 + 0xA9,
             "é -> ' ' <0xC3> <0xA9>: n %d", n);
    char bb[2];
    KV_CHECK(strcmp(kv_tokenizer_decode(&t, 5, 3 + 'A', bb), "A") == 0, "decode <0x41>");
    KV_CHECK(strcmp(kv_tokenizer_decode(&t, 1, 354, bb), "t") == 0, "space after BOS kept");
    KV_CHECK(strcmp(kv_tokenizer_decode(&t, 7, 354, bb), " t") == 0, "space not after BOS");
    KV_CHECK(strcmp(kv_tokenizer_decode(&t, 1, 512, bb), "") == 0 &&
                 strcmp(kv_tokenizer_decode(&t, 1, -1, bb), "") == 0, "out-of-range ids");

    /* random strings over a small alphabet: the fast merge equals llama2.c's loop */
    kv_rng r;
    kv_rng_seed(&r, 42);
    const char alphabet[] = "the an ing\xc3\xa9.,Tx";
    char text[400];
    for (int trial = 0; trial < 200; trial++) {
        int len = 1 + (int)(kv_rng_u32(&r) % 300);
        for (int i = 0; i < len; i++) text[i] = alphabet[kv_rng_u32(&r) % (sizeof alphabet - 1)];
        text[len] = '\0';
        char what[32];
        snprintf(what, sizeof what, "random %d", trial);
        check_round_trip(&t, text, what);
    }
    kv_tokenizer_free(&t);

    /* larger vocabularies grow longer merged tokens; all still distinct and encodable */
    KV_CHECK(kv_tokenizer_bytes(&t, 12000, &err) == KV_OK && t.max_token_length == 6,
             "bytes(12000): %s", err.msg);
    KV_CHECK(t.lengths[11999] == 3, "token 11999 has length %d, want 3", t.lengths[11999]);
    check_round_trip(&t, "the quick brown fox jumps over the lazy dog", "vocab 12000");
    kv_tokenizer_free(&t);
    KV_CHECK(kv_tokenizer_bytes(&t, 258, &err) == KV_ERR_ARG && strstr(err.msg, "vocab_size"),
             "bytes(258) accepted");
    KV_CHECK(kv_tokenizer_bytes(&t, 259, &err) == KV_OK, "bytes(259): %s", err.msg);
    /* no " " token at all: the dummy prefix is the byte token <0x20>, decoded away after BOS */
    check_round_trip(&t, "no space token", "vocab 259");
    kv_tokenizer_free(&t);
}

static void test_hand_vocab(void)
{
    kv_tokenizer t;
    kv_err err = {{0}};
    write_hand(file("hand.bin"));
    int rc = kv_tokenizer_read(file("hand.bin"), HAND_N, &t, &err);
    KV_CHECK(rc == KV_OK, "read hand vocab: %s", err.msg);
    if (rc) return;
    KV_CHECK(t.byte_base == 3 && t.max_token_length == 6 && t.lengths[270] == 3 &&
                 memcmp(t.vocab[270], "x\0y", 4) == 0, "hand vocab fields");

    /* "abc": [<s> ' ' a b c]; best pair "bc" (-0.5) -> [' ' a bc]; then " a" (-2) beats
     * "abc" (-3) -> [" a" bc]; then " abc" (-4) -> [<s> " abc"] */
    int ids[32], n = 0;
    kv_tokenizer_encode(&t, "abc", 1, 0, ids, &n, &err);
    KV_CHECK(n == 2 && ids[0] == 1 && ids[1] == 267, "'abc' -> n %d [%d %d]", n, ids[0], ids[1]);
    /* ties go to the leftmost pair: "aaa" -> ' ' [aa] a, not ' ' a [aa]; " a" (-2) loses to
     * "aa" (-1), and neither " aa" nor "aaa" exists */
    kv_tokenizer_encode(&t, "aaa", 0, 0, ids, &n, &err);
    KV_CHECK(n == 3 && ids[0] == 259 && ids[1] == 269 && ids[2] == 260,
             "'aaa' -> n %d [%d %d %d]", n, ids[0], ids[1], ids[2]);
    /* a codepoint in the vocabulary is one token; one that is not falls back to bytes */
    kv_tokenizer_encode(&t, "\xc3\xa9\xc3\xbc", 0, 1, ids, &n, &err);
    KV_CHECK(n == 5 && ids[0] == 259 && ids[1] == 268 && ids[2] == 3 + 0xC3 &&
                 ids[3] == 3 + 0xBC && ids[4] == 2, "'éü' -> n %d", n);
    check_round_trip(&t, "abcab aab cba \xc3\xa9 b", "hand");

    /* write -> read gives identical bytes back, the NUL-containing token included */
    KV_CHECK(kv_tokenizer_write(file("hand2.bin"), &t, &err) == KV_OK, "write: %s", err.msg);
    kv_tokenizer u;
    rc = kv_tokenizer_read(file("hand2.bin"), HAND_N, &u, &err);
    KV_CHECK(rc == KV_OK, "reread: %s", err.msg);
    if (rc == KV_OK) {
        int same = u.vocab_size == t.vocab_size && u.max_token_length == t.max_token_length &&
                   u.byte_base == t.byte_base &&
                   memcmp(u.lengths, t.lengths, sizeof(int) * (size_t)t.vocab_size) == 0 &&
                   memcmp(u.scores, t.scores, sizeof(float) * (size_t)t.vocab_size) == 0;
        for (int i = 0; i < t.vocab_size && same; i++)
            same = memcmp(u.vocab[i], t.vocab[i], (size_t)t.lengths[i] + 1) == 0;
        KV_CHECK(same, "tokenizer differs after write/read");
        kv_tokenizer_free(&u);
    }
    FILE *a = fopen(file("hand.bin"), "rb"), *b = fopen(file("hand2.bin"), "rb");
    int ca, cb, eq = a && b;
    while (eq && (ca = fgetc(a)) != EOF) eq = (cb = fgetc(b)) == ca;
    if (eq) eq = fgetc(b) == EOF;
    if (a) fclose(a);
    if (b) fclose(b);
    KV_CHECK(eq, "rewritten tokenizer.bin differs byte for byte");
    kv_tokenizer_free(&t);

    /* the embedded vocabulary round-trips through a file too */
    kv_tokenizer_bytes(&t, 600, &err);
    KV_CHECK(kv_tokenizer_write(file("bytes.bin"), &t, &err) == KV_OK, "write bytes: %s", err.msg);
    rc = kv_tokenizer_read(file("bytes.bin"), 600, &u, &err);
    KV_CHECK(rc == KV_OK, "read bytes: %s", err.msg);
    if (rc == KV_OK) {
        int same = u.byte_base == 3 && u.max_token_length == t.max_token_length &&
                   memcmp(u.scores, t.scores, 4 * 600) == 0;
        for (int i = 0; i < 600 && same; i++) same = strcmp(u.vocab[i], t.vocab[i]) == 0;
        KV_CHECK(same, "embedded tokenizer differs after write/read");
        kv_tokenizer_free(&u);
    }
    KV_CHECK(kv_tokenizer_write("/nonexistent-kvlab-dir/tok.bin", &t, &err) == KV_ERR_IO,
             "write into a missing folder");
    kv_tokenizer_free(&t);
}

static void expect_fail(const char *p, int vocab, int status, const char *want, const char *what)
{
    kv_tokenizer t;
    kv_err err = {{0}};
    int rc = kv_tokenizer_read(p, vocab, &t, &err);
    KV_CHECK(rc == status, "%s: status %s, want %s (%s)", what, kv_status_name(rc),
             kv_status_name(status), err.msg);
    KV_CHECK(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", what, err.msg, want);
    KV_CHECK(t.vocab == NULL && t.sorted == NULL && t.vocab_size == 0, "%s: not left zeroed", what);
}

static void test_bad_files(void)
{
    FILE *f;
    expect_fail(file("missing.bin"), 10, KV_ERR_IO, "cannot open", "missing file");
    f = fopen(file("empty.bin"), "wb");
    fclose(f);
    expect_fail(file("empty.bin"), 10, KV_ERR_FORMAT, "truncated", "empty file");
    write_hand(file("ok.bin"));
    expect_fail(file("ok.bin"), 0, KV_ERR_ARG, "vocab_size (0)", "zero vocab_size");
    expect_fail(file("ok.bin"), -4, KV_ERR_ARG, "vocab_size (-4)", "negative vocab_size");
    expect_fail(file("ok.bin"), HAND_N + 1, KV_ERR_FORMAT, "truncated at token 271",
                "vocab_size larger than the file");
    expect_fail(file("ok.bin"), HAND_N - 1, KV_ERR_FORMAT, "trailing bytes",
                "vocab_size smaller than the file");

    f = open_tok(file("maxlen.bin"), 0);
    fclose(f);
    expect_fail(file("maxlen.bin"), 1, KV_ERR_FORMAT, "max_token_length (0)", "zero max length");
    f = open_tok(file("maxlen.bin"), 1 << 30);
    fclose(f);
    expect_fail(file("maxlen.bin"), 1, KV_ERR_FORMAT, "max_token_length (1073741824)",
                "absurd max length");

    f = open_tok(file("neg.bin"), 8);
    for (int i = 0; i < 5; i++) put_tok(f, "abc", 3, 0.0f);
    put_tok(f, "", -3, 0.0f); /* token 5 */
    fclose(f);
    expect_fail(file("neg.bin"), 8, KV_ERR_FORMAT, "token 5 has length -3", "negative length");

    f = open_tok(file("long.bin"), 4);
    put_tok(f, "abc", 3, 0.0f);
    put_tok(f, "abcdefgh", 8, 0.0f); /* token 1, longer than max_token_length 4 */
    fclose(f);
    expect_fail(file("long.bin"), 2, KV_ERR_FORMAT, "token 1 has length 8", "token too long");

    f = open_tok(file("nan.bin"), 8);
    for (int i = 0; i < 4; i++) put_tok(f, "ab", 2, -1.0f);
    put_tok(f, "cd", 2, NAN); /* token 4 */
    fclose(f);
    expect_fail(file("nan.bin"), 5, KV_ERR_FORMAT, "score of token 4 is NaN", "NaN score");
    f = open_tok(file("inf.bin"), 8);
    put_tok(f, "ab", 2, INFINITY);
    fclose(f);
    expect_fail(file("inf.bin"), 1, KV_ERR_FORMAT, "score of token 0 is infinite", "inf score");

    f = open_tok(file("cut.bin"), 8);
    for (int i = 0; i < 7; i++) put_tok(f, "ab", 2, 0.0f);
    float s = 0.0f;
    int32_t len = 6;
    fwrite(&s, 4, 1, f);
    fwrite(&len, 4, 1, f);
    fwrite("abc", 1, 3, f); /* token 7 promises 6 bytes, has 3 */
    fclose(f);
    expect_fail(file("cut.bin"), 8, KV_ERR_FORMAT, "bytes of token 7", "truncated token bytes");
    f = open_tok(file("cut2.bin"), 8);
    put_tok(f, "ab", 2, 0.0f);
    fwrite(&s, 4, 1, f); /* token 1: score, no length */
    fclose(f);
    expect_fail(file("cut2.bin"), 2, KV_ERR_FORMAT, "truncated at token 1", "truncated token header");
    f = open_tok(file("ok2.bin"), 8); /* and a minimal well-formed file reads */
    put_tok(f, "ab", 2, 0.0f);
    put_tok(f, "", 0, 0.0f);
    fclose(f);
    kv_tokenizer t;
    kv_err err = {{0}};
    KV_CHECK(kv_tokenizer_read(file("ok2.bin"), 2, &t, &err) == KV_OK && t.byte_base == -1,
             "minimal file: %s", err.msg);
    int ids[8], n;
    KV_CHECK(kv_tokenizer_encode(&t, "ab", 0, 0, ids, &n, &err) == KV_ERR_ARG,
             "encode without ' ' or byte tokens should fail");
    kv_tokenizer_free(&t);
}

static void cleanup(void)
{
    const char *names[] = {"hand.bin", "hand2.bin", "bytes.bin", "empty.bin", "ok.bin",
                           "maxlen.bin", "neg.bin", "long.bin", "nan.bin", "inf.bin",
                           "cut.bin", "cut2.bin", "ok2.bin"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) remove(file(names[i]));
    rmdir(dir);
}

int main(void)
{
    snprintf(dir, sizeof dir, "test_tokenizer_tmp_%ld", (long)getpid());
    if (mkdir(dir, 0755) != 0) {
        printf("cannot create %s\n", dir);
        return 1;
    }
    test_embedded();
    test_hand_vocab();
    test_bad_files();
    cleanup();
    return kv_test_finish();
}
