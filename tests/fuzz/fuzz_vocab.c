/*
 * Fuzz target: the GGUF tokenizers (kv_vocab.h) on arbitrary bytes.
 *
 * Input: one byte of flags (bit 0: the SentencePiece-style vocabulary instead of byte-level
 * BPE; bit 1: special = 1; bit 2: add_bos = 1), then the text, every byte of it (NULs too).
 * The vocabularies are the committed tiny GGUF files of tests/data/vocab, read once through
 * kv_gguf_open() and kv_vocab_from_gguf().
 *
 * What must hold: encode succeeds, with every id inside the vocabulary and no more ids than
 * the text can give (3 a byte: an invalid byte is U+FFFD's three); and decoding the ids gives
 * the text back, exactly where it is valid UTF-8 and otherwise as llama.cpp reads it:
 *   byte-level BPE: a byte that starts no character becomes U+FFFD (EF BF BD), an overlong
 *     form or a surrogate with all its bytes is read as its codepoint (expected_bpe());
 *   SentencePiece: " " + the text, each "▁" symbol a space (expected_spm()); special = 0 only,
 *     since a special token would put another space after it.
 * The expectations are written here from those rules, not with the library's UTF-8 reader.
 */
#include "fuzz_common.h"
#include "kv_gguf.h"
#include "kv_vocab.h"

#ifndef KV_VOCAB_DATA
#error "KV_VOCAB_DATA: the folder of tiny-bpe.gguf and tiny-spm.gguf (tests/CMakeLists.txt)"
#endif

static kv_vocab *vocab[2];

static kv_vocab *load(const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", KV_VOCAB_DATA, name);
    kv_gguf *g = NULL;
    kv_vocab *v = NULL;
    kv_err err;
    int st = kv_gguf_open(path, &g, &err);
    if (!st) st = kv_vocab_from_gguf(g, &v, &err);
    kv_gguf_close(g);
    FUZZ_REQUIRE(st == KV_OK, "%s: %s", path, err.msg);
    return v;
}

/* length of the well-formed UTF-8 character at s (RFC 3629: no overlong form, no surrogate,
 * nothing past U+10FFFF), or 0 */
static size_t utf8_char(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
    if (c == 0xED && s[1] >= 0xA0) return 0; /* a surrogate */
    if (c == 0xF0 && s[1] < 0x90) return 0; /* overlong */
    if (c == 0xF4 && s[1] >= 0x90) return 0; /* past U+10FFFF */
    return len;
}

/* cpt as UTF-8, shortest form, into out; its length */
static size_t put_utf8(uint32_t c, unsigned char *out)
{
    if (c < 0x80) return out[0] = (unsigned char)c, 1;
    if (c < 0x800) return out[0] = (unsigned char)(0xC0 | c >> 6), out[1] = (unsigned char)(0x80 | (c & 63)), 2;
    out[0] = (unsigned char)(0xE0 | c >> 12), out[1] = (unsigned char)(0x80 | (c >> 6 & 63));
    out[2] = (unsigned char)(0x80 | (c & 63));
    return 3; /* only surrogates and overlong forms come here: all below U+10000 */
}

/* the text as byte-level BPE gives it back: well-formed characters as they are; a byte that
 * starts none is U+FFFD, except a lead byte with all its continuation bytes (an overlong form
 * or a surrogate), which llama.cpp reads as its codepoint and writes back shortest */
static size_t expected_bpe(const unsigned char *t, size_t n, unsigned char *out)
{
    size_t at = 0;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_char(t + i, n - i);
        if (len) {
            memcpy(out + at, t + i, len);
            at += len, i += len;
            continue;
        }
        unsigned c = t[i];
        size_t want = c >= 0xC0 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xF0 && c < 0xF8 ? 4 : 0;
        int whole = want && want <= n - i;
        uint32_t cpt = c & (0x7F >> want);
        for (size_t k = 1; whole && k < want; k++) {
            whole = (t[i + k] & 0xC0) == 0x80;
            cpt = cpt << 6 | (t[i + k] & 63u);
        }
        if (whole && cpt <= 0x10FFFF) {
            at += put_utf8(cpt, out + at);
            i += want;
        } else {
            memcpy(out + at, "\xEF\xBF\xBD", 3);
            at += 3, i++;
        }
    }
    return at;
}

/* the text as SentencePiece gives it back: " " + text with spaces as "▁", cut into symbols by
 * each lead byte's length; a symbol that is "▁" comes back a space, any other as its bytes (a
 * "▁" that invalid UTF-8 before it swallowed into another symbol stays three bytes) */
static size_t expected_spm(const unsigned char *t, size_t n, unsigned char *esc, unsigned char *out)
{
    size_t m = 0, at = 0;
    if (n == 0) return 0;
    memcpy(esc, "\xE2\x96\x81", 3), m = 3;
    for (size_t i = 0; i < n; i++) {
        if (t[i] == ' ') memcpy(esc + m, "\xE2\x96\x81", 3), m += 3;
        else esc[m++] = t[i];
    }
    for (size_t i = 0; i < m;) {
        unsigned hi = esc[i] >> 4;
        size_t len = hi == 0xF ? 4 : hi == 0xE ? 3 : hi >= 0xC ? 2 : 1;
        if (len > m - i) len = m - i;
        if (len == 3 && memcmp(esc + i, "\xE2\x96\x81", 3) == 0) out[at++] = ' ';
        else memcpy(out + at, esc + i, len), at += len;
        i += len;
    }
    return at;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (!vocab[0]) { /* once per process: the target tests encoding, not loading */
        vocab[0] = load("tiny-bpe.gguf");
        vocab[1] = load("tiny-spm.gguf");
    }
    const int spm = data[0] & 1, special = spm ? 0 : (data[0] >> 1) & 1, bos = (data[0] >> 2) & 1;
    const kv_vocab *v = vocab[spm];
    const char *text = (const char *)data + 1;
    const size_t n = size - 1;
    if (n > (1 << 20)) return 0;
    const int cap = (int)(3 * n + 8); /* 3 ids a byte at most, BOS, EOS */
    int *ids = malloc((size_t)cap * sizeof *ids);
    unsigned char *back = malloc(6 * n + 72), *want = malloc(3 * n + 8), *esc = malloc(3 * n + 8);
    FUZZ_REQUIRE(ids && back && want && esc, "out of memory");
    int got = -1;
    kv_err err;
    FUZZ_REQUIRE(kv_vocab_encode(v, text, n, bos, special, ids, cap, &got, &err) == KV_OK,
                 "encode: %s", err.msg);
    int first = 0;
    if (spm && bos) { /* tiny-spm adds BOS; tiny-bpe adds none */
        FUZZ_REQUIRE(got >= 1 && ids[0] == kv_vocab_bos(v), "no BOS");
        first = 1;
    }
    size_t at = 0;
    for (int i = 0; i < got; i++) {
        FUZZ_REQUIRE(ids[i] >= 0 && ids[i] < kv_vocab_size(v), "id %d at %d", ids[i], i);
        if (i < first) continue;
        int k = kv_vocab_piece(v, ids[i], (char *)back + at, 64);
        FUZZ_REQUIRE(k >= 0 && k <= 64, "piece of %d: %d bytes", ids[i], k);
        at += (size_t)k;
        FUZZ_REQUIRE(at <= 6 * n + 8, "decoded %zu bytes from %zu", at, n);
    }
    size_t w = spm ? expected_spm((const unsigned char *)text, n, esc, want)
                   : expected_bpe((const unsigned char *)text, n, want);
    FUZZ_REQUIRE(at == w && memcmp(back, want, w) == 0, "%s: %zu bytes back, want %zu",
                 spm ? "SentencePiece" : "byte-level BPE", at, w);
    free(ids);
    free(back);
    free(want);
    free(esc);
    return 0;
}
