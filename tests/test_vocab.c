/*
 * The GGUF tokenizers without a file (kv_vocab.h, kv_unicode.h): Unicode classes against the
 * Unicode standard, UTF-8 as llama.cpp reads it, GPT-2's byte map, each pre-tokenizer pattern
 * on strings whose split the pattern fixes, and small hand-built vocabularies whose ids follow
 * from the merge rules (rank order, leftmost first; score order; byte fallback; special tokens
 * only when asked). The real vocabularies against llama.cpp's ids: test_vocab_gguf.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_test.h"
#include "kv_unicode.h"
#include "kv_vocab.h"
#include "kv_vocab_internal.h"

/* ---- Unicode --------------------------------------------------------------------------- */

static void test_classes(void)
{
    static const struct {
        uint32_t cpt;
        int cls;
        const char *what;
    } cases[] = {
        {'a', KV_UC_LETTER, "Ll"},           {'Z', KV_UC_LETTER, "Lu"},
        {'7', KV_UC_NUMBER, "Nd"},           {' ', KV_UC_SPACE, "Zs space"},
        {'\t', KV_UC_SPACE, "tab"},          {'\n', KV_UC_SPACE, "line feed"},
        {'!', KV_UC_PUNCT, "Po"},            {'_', KV_UC_PUNCT, "Pc"},
        {'$', 0, "Sc"},                      {0x2014, KV_UC_PUNCT, "em dash (Pd)"},
        {0x300C, KV_UC_PUNCT, "corner bracket (Ps)"}, {0xAB, KV_UC_PUNCT, "« (Pi)"},
        {0x00, 0, "NUL"},                    {0x85, KV_UC_SPACE, "NEL"},
        {0xA0, KV_UC_SPACE, "no-break space"}, {0xB2, KV_UC_NUMBER, "superscript two (No)"},
        {0xAA, KV_UC_LETTER, "ordinal a (Lo)"}, {0x01C5, KV_UC_LETTER, "Dž (Lt)"},
        {0x02B0, KV_UC_LETTER, "modifier h (Lm)"}, {0x0301, 0, "combining acute (Mn)"},
        {0x0660, KV_UC_NUMBER, "Arabic-Indic zero"}, {0x2160, KV_UC_NUMBER, "Roman one (Nl)"},
        {0x1680, KV_UC_SPACE, "Ogham space"}, {0x200B, 0, "zero width space (Cf)"},
        {0x2028, KV_UC_SPACE, "line separator"}, {0x3000, KV_UC_SPACE, "ideographic space"},
        {0x4E2D, KV_UC_LETTER, "中"},         {0xAC00, KV_UC_LETTER, "가"},
        {0xFFFD, 0, "replacement (So)"},      {0x1F600, 0, "emoji (So)"},
        {0x31350, KV_UC_LETTER, "CJK ext. H, Unicode 15.0"},
        {0x2EBF0, KV_UC_LETTER, "CJK ext. I, Unicode 15.1"},
        {0xE000, 0, "private use"},           {0x10FFFF, 0, "last codepoint"},
        {0x110000, 0, "past Unicode"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        KV_CHECK(kv_unicode_class(cases[i].cpt) == cases[i].cls, "U+%04X %s: class %d, want %d",
                 (unsigned)cases[i].cpt, cases[i].what, kv_unicode_class(cases[i].cpt), cases[i].cls);
    KV_CHECK(strcmp(kv_unicode_version, "15.1.0") == 0, "table from Unicode %s", kv_unicode_version);
    for (int i = 1; i < kv_unicode_n_ranges; i++) /* ascending, disjoint: the search needs it */
        if (kv_unicode_ranges[i].first <= kv_unicode_ranges[i - 1].last)
            KV_CHECK(0, "range %d overlaps the one before", i);
}

static void test_utf8(void)
{
    static const struct {
        const char *s;
        size_t n;
        uint32_t cpt;
        int used;
    } cases[] = {
        {"A", 1, 'A', 1},
        {"\xC3\xA9", 2, 0xE9, 2},
        {"\xE4\xB8\xAD", 3, 0x4E2D, 3},
        {"\xF0\x9F\x98\x80", 4, 0x1F600, 4},
        {"\x80", 1, 0xFFFD, 1},             /* a stray continuation byte */
        {"\xC3", 1, 0xFFFD, 1},             /* cut short by the end */
        {"\xC3" "A", 2, 0xFFFD, 1},         /* cut short by a non-continuation */
        {"\xE4\xB8", 2, 0xFFFD, 1},
        {"\xF8\x80\x80\x80", 4, 0xFFFD, 1}, /* no such lead byte */
        {"\xC0\x80", 2, 0, 2},              /* overlong: read, not refused (llama.cpp) */
        {"\xED\xA0\x80", 3, 0xD800, 3},     /* a surrogate: read too */
        {"\xF4\x8F\xBF\xBF", 4, 0x10FFFF, 4},
        {"\xF5\x80\x80\x80", 4, 0xFFFD, 1}, /* past U+10FFFF */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int used;
        uint32_t c = kv_utf8_read((const unsigned char *)cases[i].s, cases[i].n, &used);
        KV_CHECK(c == cases[i].cpt && used == cases[i].used, "case %zu: U+%04X/%d, want U+%04X/%d",
                 i, (unsigned)c, used, (unsigned)cases[i].cpt, cases[i].used);
    }
    unsigned char buf[4];
    for (uint32_t c = 0; c <= 0x10FFFF; c += (c < 0x800 ? 1 : 97)) {
        int n = kv_utf8_write(c, buf), used;
        if (c >= 0xD800 && c <= 0xDFFF) continue;
        if (kv_utf8_read(buf, (size_t)n, &used) != c || used != n) {
            KV_CHECK(0, "U+%04X does not read back", (unsigned)c);
            break;
        }
    }
    KV_CHECK(kv_utf8_len(0x41) == 1 && kv_utf8_len(0x80) == 1 && kv_utf8_len(0xC3) == 2 &&
             kv_utf8_len(0xE4) == 3 && kv_utf8_len(0xF0) == 4, "lead-byte lengths");
}

static void test_gpt2_bytes(void)
{
    /* GPT-2's bytes_to_unicode(): printable bytes stay, the 68 others take U+0100.. in order */
    KV_CHECK(kv_gpt2_byte_char('a') == 'a' && kv_gpt2_byte_char('!') == '!', "printable bytes");
    KV_CHECK(kv_gpt2_byte_char(0x00) == 0x100, "NUL -> U+0100");
    KV_CHECK(kv_gpt2_byte_char(' ') == 0x120, "space -> U+0120 'Ġ'");
    KV_CHECK(kv_gpt2_byte_char('\n') == 0x10A, "newline -> U+010A 'Ċ'");
    KV_CHECK(kv_gpt2_byte_char(0x7F) == 0x121, "DEL -> U+0121");
    KV_CHECK(kv_gpt2_byte_char(0xAD) == 0x143, "soft hyphen -> U+0143, the last");
    int seen[0x144] = {0}, ok = 1;
    for (int b = 0; b < 256; b++) {
        uint32_t c = kv_gpt2_byte_char((unsigned char)b);
        ok &= c < 0x144 && !seen[c] && kv_gpt2_char_byte(c) == b;
        if (c < 0x144) seen[c] = 1;
    }
    KV_CHECK(ok, "256 bytes, 256 distinct characters, each back to its byte");
    KV_CHECK(kv_gpt2_char_byte(0x20) == -1 && kv_gpt2_char_byte(0x144) == -1 &&
             kv_gpt2_char_byte(0x4E2D) == -1, "characters of no byte");
}

/* ---- pre-tokenizers -------------------------------------------------------------------- */

/* the words of utf8 under pattern pre, joined by '|' */
static void split(int pre, const char *utf8, char *out)
{
    size_t n = strlen(utf8);
    uint32_t cpt[256];
    int len[256], tmp[256], nc = 0;
    for (size_t i = 0; i < n;) {
        int used;
        cpt[nc++] = kv_utf8_read((const unsigned char *)utf8 + i, n - i, &used);
        i += (size_t)used;
    }
    int nw = kv_vocab_pre_split(pre, cpt, nc, len, tmp);
    char *o = out;
    for (int w = 0, c = 0; w < nw; w++) {
        if (w) *o++ = '|';
        for (int k = 0; k < len[w]; k++) o += kv_utf8_write(cpt[c++], (unsigned char *)o);
    }
    *o = '\0';
}

static void test_pre(void)
{
    static const struct {
        int pre;
        const char *text, *words;
    } cases[] = {
        /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
        {KV_PRE_GPT2, "Hello world's  123 !!\n", "Hello| world|'s| | 123| !!|\n"},
        {KV_PRE_GPT2, "I'VE it'll", "I|'|VE| it|'ll"},            /* case-sensitive */
        {KV_PRE_GPT2, "a  \t b", "a|  \t| b"},                    /* a run keeps one space back */
        {KV_PRE_GPT2, "x   ", "x|   "},                           /* at the end: \s+ takes all */
        {KV_PRE_GPT2, "3.14", "3|.|14"},
        {KV_PRE_GPT2, "\xC2\xA0" "a", "\xC2\xA0|a"},               /* NBSP is \s, not ' ' */
        {KV_PRE_GPT2, "日本語 テスト", "日本語| テスト"},
        {KV_PRE_GPT2, "\xF0\x9F\x98\x80\xF0\x9F\x98\x80 ok", "\xF0\x9F\x98\x80\xF0\x9F\x98\x80| ok"},
        /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|
         * \s+(?!\S)|\s+ */
        {KV_PRE_LLAMA3, "I'VE 12345 abc\r\n\n  x", "I|'VE| |123|45| abc|\r\n\n| | x"},
        {KV_PRE_LLAMA3, "(hello)\n\n", "(hello|)\n\n"},
        {KV_PRE_LLAMA3, " ;; ok  \n  z", " ;;| ok|  \n| | z"},
        {KV_PRE_LLAMA3, "_x 1234567", "_x| |123|456|7"},
        /* qwen2: the same with \p{N} */
        {KV_PRE_QWEN2, "x 2024", "x| |2|0|2|4"},
        /* smollm: \p{N}, then GPT-2's: a digit never joins its space */
        {KV_PRE_SMOLLM, "abc123 4", "abc|1|2|3| |4"},
        {KV_PRE_SMOLLM, "v2.0 x", "v|2|.|0| x"},
        {KV_PRE_SMOLLM, "\xD9\xA3\xC2\xB2", "\xD9\xA3|\xC2\xB2"},  /* non-ASCII numbers too */
        /* default: [\p{P}\$\+<=>\^~\|]+, GPT-2's, \p{N}+, [0-9][0-9][0-9] */
        {KV_PRE_DEFAULT, "Hello, world!!! 12345 $x", "Hello|,| world|!!!| |123|45| |$|x"},
        {KV_PRE_DEFAULT, "a`b 1234567\xD9\xA3", "a|`|b| |123|456|7\xD9\xA3"},
        {KV_PRE_DEFAULT, "\xE3\x80\x8Cok\xE3\x80\x8D.", "\xE3\x80\x8C|ok|\xE3\x80\x8D."},
    };
    char out[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        split(cases[i].pre, cases[i].text, out);
        KV_CHECK(strcmp(out, cases[i].words) == 0, "pre %d case %zu: '%s', want '%s'",
                 cases[i].pre, i, out, cases[i].words);
    }
}

/* ---- hand-built vocabularies ----------------------------------------------------------- */

#define MAX_TOK 300

typedef struct {
    kv_vocab_str tok[MAX_TOK];
    float score[MAX_TOK];
    int type[MAX_TOK];
    kv_vocab_str merge[16];
    int n, n_merges;
} toy;

static int add(toy *t, const char *s, float score, int type)
{
    t->tok[t->n] = (kv_vocab_str){s, strlen(s)};
    t->score[t->n] = score;
    t->type[t->n] = type;
    return t->n++;
}

static kv_vocab_desc desc_of(const toy *t, const char *model, const char *pre)
{
    kv_vocab_desc d = {model, pre, t->n, t->tok, t->score, t->type, t->n_merges, t->merge,
                       KV_VOCAB_UNSET, KV_VOCAB_UNSET, KV_VOCAB_UNSET, KV_VOCAB_UNSET,
                       KV_VOCAB_UNSET, KV_VOCAB_UNSET};
    return d;
}

/* the vocabulary of t, or NULL after a failed check */
static kv_vocab *make(const toy *t, const char *model, const char *pre)
{
    kv_vocab_desc d = desc_of(t, model, pre);
    kv_vocab *v;
    kv_err err;
    int st = kv_vocab_create(&d, &v, &err);
    KV_CHECK(st == KV_OK, "toy %s: %s", model, err.msg);
    return st ? NULL : v;
}

/* encode and compare with want[0..nw) */
static void expect(const kv_vocab *v, const char *text, int add_bos, int special, const int *want,
                   int nw, const char *what)
{
    int ids[64], n = -1;
    kv_err err;
    int st = kv_vocab_encode(v, text, strlen(text), add_bos, special, ids, 64, &n, &err);
    int ok = st == KV_OK && n == nw && (nw == 0 || memcmp(ids, want, (size_t)nw * sizeof *ids) == 0);
    KV_CHECK(ok, "%s: status %d, %d ids (want %d): %d %d %d ...", what, st, n, nw,
             n > 0 ? ids[0] : -1, n > 1 ? ids[1] : -1, n > 2 ? ids[2] : -1);
}

static void expect_piece(const kv_vocab *v, int id, const char *want, int want_len)
{
    char buf[32];
    int n = kv_vocab_piece(v, id, buf, sizeof buf);
    KV_CHECK(n == want_len && memcmp(buf, want, (size_t)want_len) == 0, "piece of %d: %d bytes",
             id, n);
}

static void test_bpe_toy(void)
{
    static toy t;
    memset(&t, 0, sizeof t);
    int a = add(&t, "a", 0, 1), b = add(&t, "b", 0, 1), c = add(&t, "c", 0, 1);
    int ab = add(&t, "ab", 0, 1), bc = add(&t, "bc", 0, 1), abc = add(&t, "abc", 0, 1);
    int sp = add(&t, "\xC4\xA0", 0, 1), sp_a = add(&t, "\xC4\xA0" "a", 0, 1);
    int aa = add(&t, "aa", 0, 1), nl = add(&t, "\xC4\x8A", 0, 1);
    int lt = add(&t, "<", 0, 1), bar = add(&t, "|", 0, 1), x = add(&t, "x", 0, 1);
    int gt = add(&t, ">", 0, 1), ctl = add(&t, "<|x|>", 0, KV_TOKEN_CONTROL);
    int byte = add(&t, "<0x41>", 0, KV_TOKEN_BYTE);
    const char *merges[] = {"b c", "a b", "a bc", "\xC4\xA0 a", "a a"};
    for (int i = 0; i < 5; i++) t.merge[i] = (kv_vocab_str){merges[i], strlen(merges[i])};
    t.n_merges = 5;
    kv_vocab *v = make(&t, "gpt2", "gpt-2");
    if (!v) return;
    /* "b c" (rank 0) before "a b" (rank 1): a + bc, then "a bc" */
    expect(v, "abc", 0, 0, (int[]){abc}, 1, "abc");
    expect(v, "ab", 0, 0, (int[]){ab}, 1, "ab");
    expect(v, "bca", 0, 0, (int[]){bc, a}, 2, "bca");
    expect(v, "aaa", 0, 0, (int[]){aa, a}, 2, "aaa: the leftmost of equal ranks");
    expect(v, " a", 0, 0, (int[]){sp_a}, 1, "space + a");
    expect(v, "a\n", 0, 0, (int[]){a, nl}, 2, "newline as U+010A");
    expect(v, "<|x|>", 0, 1, (int[]){ctl}, 1, "control token, special = 1");
    expect(v, "<|x|>", 0, 0, (int[]){lt, bar, x, bar, gt}, 5, "control token as text");
    expect(v, "a<|x|>b", 0, 1, (int[]){a, ctl, b}, 3, "control token between words");
    expect(v, "a?b", 0, 0, (int[]){a, b}, 2, "a byte with no token is dropped");
    expect(v, "", 1, 0, NULL, 0, "gpt-2 adds no BOS");
    expect_piece(v, sp_a, " a", 2);
    expect_piece(v, nl, "\n", 1);
    expect_piece(v, ctl, "<|x|>", 5);
    expect_piece(v, byte, "A", 1);
    KV_CHECK(kv_vocab_piece(v, -1, NULL, 0) == -1 && kv_vocab_piece(v, t.n, NULL, 0) == -1,
             "ids outside the vocabulary");
    KV_CHECK(kv_vocab_find(v, "abc") == abc && kv_vocab_find(v, "abcd") == -1, "find");
    KV_CHECK(kv_vocab_is_control(v, ctl) && !kv_vocab_is_control(v, a), "is_control");
    KV_CHECK(kv_vocab_size(v) == t.n && kv_vocab_bos(v) == 11 && kv_vocab_eos(v) == 11,
             "size and gpt2's default BOS/EOS");
    int ids[2], n = 0;
    kv_err err;
    int st = kv_vocab_encode(v, "a b c", 5, 0, 0, ids, 2, &n, &err);
    KV_CHECK(st == KV_ERR_CAPACITY && n == 5, "capacity: status %d, %d needed", st, n);
    (void)c, (void)sp;
    kv_vocab_free(v);
}

static void test_spm_toy(void)
{
    static toy t;
    static char names[256][7];
    memset(&t, 0, sizeof t);
    int unk = add(&t, "<unk>", 0, KV_TOKEN_UNKNOWN), bos = add(&t, "<s>", 0, KV_TOKEN_CONTROL);
    int eos = add(&t, "</s>", 0, KV_TOKEN_CONTROL), b0 = t.n;
    for (int i = 0; i < 256; i++) {
        snprintf(names[i], sizeof names[i], "<0x%02X>", i);
        add(&t, names[i], 0, KV_TOKEN_BYTE);
    }
    int u = add(&t, "\xE2\x96\x81", -1, 1), a = add(&t, "a", -2, 1), b = add(&t, "b", -2, 1);
    int ua = add(&t, "\xE2\x96\x81" "a", -5, 1), ab = add(&t, "ab", -3, 1);
    int uab = add(&t, "\xE2\x96\x81" "ab", -4, 1);
    kv_vocab *v = make(&t, "llama", NULL);
    if (!v) return;
    /* "▁ab": "ab" (-3) beats "▁a" (-5), then "▁ab" */
    expect(v, "ab", 0, 0, (int[]){uab}, 1, "ab with the space prefix");
    expect(v, "ab", 1, 0, (int[]){bos, uab}, 2, "BOS when asked");
    expect(v, "a a", 0, 0, (int[]){ua, ua}, 2, "spaces as U+2581");
    expect(v, "b\xC3\xA9", 0, 0, (int[]){u, b, b0 + 0xC3, b0 + 0xA9}, 4, "byte fallback");
    expect(v, "<s>a", 0, 1, (int[]){bos, ua}, 2, "a prefix space after a special token");
    expect(v, "", 1, 0, (int[]){bos}, 1, "empty text: BOS only");
    KV_CHECK(kv_vocab_bos(v) == bos && kv_vocab_eos(v) == eos, "llama's default BOS/EOS");
    expect_piece(v, uab, " ab", 3);
    expect_piece(v, b0 + 0x0A, "\n", 1);
    expect_piece(v, b0, "\0", 1);
    expect_piece(v, bos, "<s>", 3);
    (void)unk, (void)a, (void)ab;
    kv_vocab_free(v);
}

static void test_refusals(void)
{
    static toy t;
    memset(&t, 0, sizeof t);
    add(&t, "a", 0, 1);
    add(&t, "b", 0, 1);
    t.merge[0] = (kv_vocab_str){"a b", 3};
    t.n_merges = 1;
    kv_vocab *v = (kv_vocab *)&t;
    kv_err err;
    kv_vocab_desc d = desc_of(&t, "gpt2", "no-such-pre");
    KV_CHECK(kv_vocab_create(&d, &v, &err) == KV_ERR_UNSUPPORTED && !v && strstr(err.msg, "no-such-pre"),
             "an unknown pre-tokenizer is named: %s", err.msg);
    d = desc_of(&t, "bert", NULL);
    KV_CHECK(kv_vocab_create(&d, &v, &err) == KV_ERR_UNSUPPORTED && strstr(err.msg, "bert"),
             "an unknown model is named: %s", err.msg);
    d = desc_of(&t, "gpt2", "gpt-2");
    d.n_merges = 0;
    KV_CHECK(kv_vocab_create(&d, &v, &err) == KV_ERR_FORMAT, "gpt2 without merges");
    add(&t, "a", 0, 1);
    d = desc_of(&t, "gpt2", "gpt-2");
    KV_CHECK(kv_vocab_create(&d, &v, &err) == KV_ERR_FORMAT && strstr(err.msg, "repeats"),
             "a duplicate token: %s", err.msg);
    d = desc_of(&t, "gpt2", "gpt-2");
    d.n_tokens = 0;
    KV_CHECK(kv_vocab_create(&d, &v, &err) == KV_ERR_FORMAT, "no tokens");
    t.n = 2;
    t.score[1] = NAN;
    d = desc_of(&t, "llama", NULL);
    KV_CHECK(kv_vocab_create(&d, &v, &err) == KV_ERR_FORMAT, "a NaN score");
}

/* byte-level BPE over all 256 byte characters: decode(encode(x)) is x for valid UTF-8, and
 * x with each invalid byte as U+FFFD's bytes otherwise */
static void test_round_trip(void)
{
    static kv_vocab_str tok[256];
    static unsigned char chars[256][2];
    for (int b = 0; b < 256; b++) {
        int n = kv_utf8_write(kv_gpt2_byte_char((unsigned char)b), chars[b]);
        tok[b] = (kv_vocab_str){(const char *)chars[b], (size_t)n};
    }
    kv_vocab_str merge = {"a b", 3};
    kv_vocab_desc d = {"gpt2", "smollm", 256, tok, NULL, NULL, 1, &merge,
                       KV_VOCAB_UNSET, KV_VOCAB_UNSET, KV_VOCAB_UNSET, KV_VOCAB_UNSET,
                       KV_VOCAB_UNSET, KV_VOCAB_UNSET};
    kv_vocab *v;
    kv_err err;
    if (kv_vocab_create(&d, &v, &err)) {
        KV_CHECK(0, "byte vocabulary: %s", err.msg);
        return;
    }
    const char *texts[] = {"héllo wörld 123 日本 😀\n\t x", "\xFF\x61\x80", "\xE4\xB8"};
    const char *want[] = {texts[0], "\xEF\xBF\xBD\x61\xEF\xBF\xBD", "\xEF\xBF\xBD\xEF\xBF\xBD"};
    for (int i = 0; i < 3; i++) {
        int ids[128], n;
        char back[256];
        size_t at = 0;
        kv_vocab_encode(v, texts[i], strlen(texts[i]), 0, 0, ids, 128, &n, &err);
        for (int k = 0; k < n; k++) at += (size_t)kv_vocab_piece(v, ids[k], back + at, 8);
        KV_CHECK(at == strlen(want[i]) && memcmp(back, want[i], at) == 0, "round trip %d", i);
    }
    kv_vocab_free(v);
}

int main(void)
{
    test_classes();
    test_utf8();
    test_gpt2_bytes();
    test_pre();
    test_bpe_toy();
    test_spm_toy();
    test_refusals();
    test_round_trip();
    return kv_test_finish();
}
