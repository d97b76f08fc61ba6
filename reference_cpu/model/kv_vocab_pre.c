/*
 * Pre-tokenizers of byte-level BPE: the text is cut into words before any merge, so that no
 * token spans a word boundary. Each vocabulary names its list of patterns
 * (tokenizer.ggml.pre); each pattern splits every piece the previous one left. The patterns
 * are regular expressions in the tokenizers they come from; here each is a hand-written
 * matcher, the pattern written above it, that gives what llama.cpp's own hand-written
 * matchers give (src/unicode.cpp: unicode_regex_split_custom_gpt2(), _llama3()), their
 * corner cases included, since the ids must be llama.cpp's.
 *
 *   gpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   llama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   qwen2   llama3 with \p{N} in place of \p{N}{1,3}
 *   smollm  \p{N}  then  gpt2
 *   default [\p{P}\$\+<=>\^~\|]+  then  gpt2  then  \p{N}+  then  [0-9][0-9][0-9]
 *           (a file that names no pre-tokenizer)
 *
 * A piece is a run [ini, end) of codepoints; a matcher never looks past its piece's end, as
 * if the piece were the whole text (llama.cpp's OUT_OF_RANGE). The classes \p{L}, \p{N} and \s
 * are kv_unicode_class()'s.
 */
#include "kv_unicode.h"
#include "kv_vocab_internal.h"

#define OUT_OF_RANGE 0xFFFFFFFFu
#define IN_PIECE 0x100 /* class bit set for every position inside the piece, even class 0 */

/* one piece being split: its codepoints, its end, and where the words go */
typedef struct {
    const uint32_t *cpt;
    int ini, end;
    int *out; /* word lengths */
    int n_out;
} piece;

static uint32_t cpt_at(const piece *p, int pos)
{
    return pos >= p->ini && pos < p->end ? p->cpt[pos] : OUT_OF_RANGE;
}

/* class bits, with IN_PIECE; 0 past either end of the piece */
static int cls_at(const piece *p, int pos)
{
    return pos >= p->ini && pos < p->end ? IN_PIECE | kv_unicode_class(p->cpt[pos]) : 0;
}

static int is_letter(int c) { return c & KV_UC_LETTER; }
static int is_number(int c) { return c & KV_UC_NUMBER; }
static int is_space(int c) { return c & KV_UC_SPACE; }
/* [^\s\p{L}\p{N}] inside the piece */
static int is_other(int c) { return (c & IN_PIECE) && !(c & (KV_UC_LETTER | KV_UC_NUMBER | KV_UC_SPACE)); }

/* a word of len codepoints; returns len */
static int word(piece *p, int len)
{
    if (len > 0) p->out[p->n_out++] = len;
    return len;
}

/* length of the contraction at pos ('s 't 'm 'd: 2; 're 've 'll: 3), 0 if none; fold: the
 * letters in either case (llama3's (?i:...); only ASCII lowercases to them, gen_tables.py checks) */
static int contraction(const piece *p, int pos, int fold)
{
    if (cpt_at(p, pos) != '\'' || pos + 1 >= p->end) return 0;
    uint32_t a = cpt_at(p, pos + 1);
    if (fold && a >= 'A' && a <= 'Z') a += 'a' - 'A';
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= p->end) return 0;
    uint32_t b = cpt_at(p, pos + 2);
    if (fold && b >= 'A' && b <= 'Z') b += 'a' - 'A';
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* the whitespace run at pos: its length; *last_rn: one past its last \r or \n, or 0 */
static int space_run(const piece *p, int pos, int *last_rn)
{
    int n = 0;
    *last_rn = 0;
    while (is_space(cls_at(p, pos + n))) {
        uint32_t c = cpt_at(p, pos + n);
        if (c == '\r' || c == '\n') *last_rn = pos + n + 1;
        n++;
    }
    return n;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
/* The last alternatives of the GPT-2 and Llama 3 patterns, at a run of n_space spaces (maybe
 * 0): \s+(?!\S) (a run followed by a non-space leaves its last space to the next word), then
 * \s+, else one codepoint alone (no alternative matched). Returns the codepoints taken. */
static int space_tail(piece *p, int pos, int n_space)
{
    if (n_space > 1 && cpt_at(p, pos + n_space) != OUT_OF_RANGE) return word(p, n_space - 1);
    if (n_space > 0) return word(p, n_space);
    return word(p, 1);
}

static void split_gpt2(piece *p)
{
    for (int pos = p->ini; pos < p->end;) {
        uint32_t c = cpt_at(p, pos);
        /* 's|'t|'re|'ve|'m|'ll|'d */
        int k = contraction(p, pos, 0);
        if (k) {
            pos += word(p, k);
            continue;
        }
        /* the optional leading space: classify what follows it */
        int start = pos, c2 = c == ' ' ? cls_at(p, pos + 1) : cls_at(p, pos);
        /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': the same run, three classes */
        int (*run)(int) = is_letter(c2) ? is_letter : is_number(c2) ? is_number
                        : is_other(c2) ? is_other : NULL;
        if (run) {
            pos += c == ' ';
            while (run(cls_at(p, pos))) pos++;
            word(p, pos - start);
            continue;
        }
        int last_rn, n_space = space_run(p, pos, &last_rn);
        pos += space_tail(p, pos, n_space);
    }
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+
 * with digits in groups of max_digits: 3 as written (Llama 3), 1 for Qwen2's \p{N} */
static void split_llama3_digits(piece *p, int max_digits)
{
    for (int pos = p->ini; pos < p->end;) {
        uint32_t c = cpt_at(p, pos);
        int cls = cls_at(p, pos);
        /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
        int k = contraction(p, pos, 1);
        if (k) {
            pos += word(p, k);
            continue;
        }
        /* [^\r\n\p{L}\p{N}]?\p{L}+: letters, perhaps after one codepoint of another kind */
        if (!(c == '\r' || c == '\n' || is_number(cls)) &&
            (is_letter(cls) || is_letter(cls_at(p, pos + 1)))) {
            int start = pos++;
            while (is_letter(cls_at(p, pos))) pos++;
            word(p, pos - start);
            continue;
        }
        /* \p{N}{1,3}: digits in threes from the left */
        if (is_number(cls)) {
            int start = pos;
            while (is_number(cls_at(p, pos))) {
                if (++pos - start >= max_digits) start += word(p, pos - start);
            }
            word(p, pos - start);
            continue;
        }
        /* ' ?[^\s\p{L}\p{N}]+[\r\n]*'. llama.cpp asks the piece-end test of the codepoint at
         * pos, not of the one after the space: a lone space at the end is taken here (the same
         * word \s+ would give) */
        int start = pos, c2 = c == ' ' ? cls_at(p, pos + 1) : cls;
        if (!(is_space(c2) || is_letter(c2) || is_number(c2))) {
            pos += c == ' ';
            while (is_other(cls_at(p, pos))) pos++;
            while (cpt_at(p, pos) == '\r' || cpt_at(p, pos) == '\n') pos++;
            word(p, pos - start);
            continue;
        }
        int last_rn, n_space = space_run(p, pos, &last_rn);
        /* \s*[\r\n]+: spaces up to and including the run's last line break */
        if (last_rn > 0) {
            pos += word(p, last_rn - pos);
            continue;
        }
        pos += space_tail(p, pos, n_space);
    }
}

static void split_llama3(piece *p) { split_llama3_digits(p, 3); }
static void split_qwen2(piece *p) { split_llama3_digits(p, 1); }

/* The patterns llama.cpp runs through std::regex rather than a matcher of its own. A match is
 * a word and so is each stretch between two matches. std::regex sees an ASCII codepoint as
 * itself and any other as one byte for its class (a space 0x0B, a number 0xD1, punctuation
 * 0xD3), which \p{N} and \p{P} then match: the classes below are that, per codepoint. */

/* \p{N}: every number codepoint a word of its own, the runs between them words too */
static void split_numbers(piece *p)
{
    int start = p->ini;
    for (int pos = p->ini; pos < p->end; pos++) {
        if (!is_number(cls_at(p, pos))) continue;
        word(p, pos - start);
        word(p, 1);
        start = pos + 1;
    }
    word(p, p->end - start);
}

/* a run of codepoints of one class is a word, and so is each run between two of them */
static void split_runs(piece *p, int (*in)(uint32_t c, int cls))
{
    for (int pos = p->ini; pos < p->end;) {
        int start = pos, match = in(p->cpt[pos], cls_at(p, pos));
        while (pos < p->end && in(p->cpt[pos], cls_at(p, pos)) == match) pos++;
        word(p, pos - start);
    }
}

/* [\p{P}\$\+<=>\^~\|]: llama.cpp's ASCII punctuation (every printable non-alphanumeric but
 * '`') and $+<=>^~|, or a non-ASCII codepoint of category P that is not a space */
static int default_punct(uint32_t c, int cls)
{
    if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) ||
                         (c >= 0x5B && c <= 0x5F) || (c >= 0x7B && c <= 0x7E);
    return (cls & KV_UC_PUNCT) && !is_space(cls);
}

static int number(uint32_t c, int cls) { return (void)c, is_number(cls) && !is_space(cls); }

static void split_punct_runs(piece *p) { split_runs(p, default_punct); }
static void split_number_runs(piece *p) { split_runs(p, number); } /* \p{N}+ */

/* [0-9][0-9][0-9]: three ASCII digits, leftmost first; what is left between them a word */
static void split_digits3(piece *p)
{
    int start = p->ini;
    for (int pos = p->ini; pos + 3 <= p->end;) {
        int three = 1;
        for (int k = 0; k < 3; k++) three &= p->cpt[pos + k] >= '0' && p->cpt[pos + k] <= '9';
        if (!three) {
            pos++;
            continue;
        }
        word(p, pos - start);
        word(p, 3);
        start = pos += 3;
    }
    word(p, p->end - start);
}

/* run one pattern over every piece of in[0..n_in) (lengths), words into out; their count */
static int apply(void (*split)(piece *), const uint32_t *cpt, const int *in, int n_in, int *out)
{
    piece p = {cpt, 0, 0, out, 0};
    for (int i = 0; i < n_in; i++) {
        p.end = p.ini + in[i];
        split(&p);
        p.ini = p.end;
    }
    return p.n_out;
}

/* patterns one after the other, each over the words the one before left (in tmp[0], one) */
static int chain(void (*const *split)(piece *), int n_split, const uint32_t *cpt, int *len, int *tmp)
{
    int n_words = 1;
    for (int k = 0; k < n_split; k++) {
        if (k > 0)
            for (int i = 0; i < n_words; i++) tmp[i] = len[i];
        n_words = apply(split[k], cpt, tmp, n_words, len);
    }
    return n_words;
}

int kv_vocab_pre_split(int pre, const uint32_t *cpt, int n, int *len, int *tmp)
{
    if (n == 0) return 0;
    tmp[0] = n; /* one piece: the whole text */
    switch (pre) {
    case KV_PRE_LLAMA3: return apply(split_llama3, cpt, tmp, 1, len);
    case KV_PRE_QWEN2: return apply(split_qwen2, cpt, tmp, 1, len);
    case KV_PRE_SMOLLM: return chain((void (*[])(piece *)){split_numbers, split_gpt2}, 2, cpt, len, tmp);
    case KV_PRE_DEFAULT:
        return chain((void (*[])(piece *)){split_punct_runs, split_gpt2, split_number_runs,
                                          split_digits3}, 4, cpt, len, tmp);
    default: return apply(split_gpt2, cpt, tmp, 1, len);
    }
}
