/*
 * The GGUF tokenizers (kv_vocab.h): the vocabulary and its lookups, the special tokens cut out
 * of the text, and decoding. The encoders are kv_vocab_bpe.c (byte-level BPE, with the
 * pre-tokenizers of kv_vocab_pre.c) and kv_vocab_spm.c (SentencePiece-style); the file reader
 * is kv_vocab_gguf.c.
 *
 * An encode runs in two steps, as llama.cpp's does:
 *   1. the special tokens are found in the text, longest first, and cut out of it: the text
 *      becomes fragments, each either a token id or plain text. Control and unknown tokens
 *      (<|im_start|>, <s>, <unk>) are found only when the caller asks (special = 1);
 *      user-defined tokens always (llama.cpp's rule: they are part of the vocabulary's text);
 *   2. each text fragment is encoded on its own, so no token spans a special token.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_unicode.h"
#include "kv_vocab_internal.h"

#define KV_VOCAB_MAX_TOKENS (1 << 24)
#define KV_VOCAB_MAX_MERGES (1 << 24)

/* ---- lookups: two open-addressing hash tables over the vocabulary's bytes ---------------- */

uint64_t kv_vocab_hash(const char *s, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

static int span_eq(const kv_vocab *v, kv_vocab_span sp, const char *s, size_t n)
{
    return sp.len == n && memcmp(v->text + sp.off, s, n) == 0;
}

int kv_vocab_lookup(const kv_vocab *v, const char *s, size_t n)
{
    size_t mask = v->tok_cap - 1;
    for (size_t i = kv_vocab_hash(s, n, KV_VOCAB_HASH_SEED) & mask;; i = (i + 1) & mask) {
        int id = v->tok_slot[i] - 1;
        if (id < 0) return -1;
        if (span_eq(v, v->tok[id], s, n)) return id;
    }
}

/* the hash of a merge: left, one byte that no UTF-8 text holds, right */
static uint64_t merge_hash(const char *l, size_t nl, const char *r, size_t nr)
{
    return kv_vocab_hash(r, nr, kv_vocab_hash("\xFF", 1, kv_vocab_hash(l, nl, KV_VOCAB_HASH_SEED)));
}

int kv_vocab_merge_rank(const kv_vocab *v, const char *l, size_t nl, const char *r, size_t nr)
{
    if (v->merge_cap == 0) return -1;
    size_t mask = v->merge_cap - 1;
    for (size_t i = merge_hash(l, nl, r, nr) & mask;; i = (i + 1) & mask) {
        int rank = v->merge_slot[i] - 1;
        if (rank < 0) return -1;
        if (span_eq(v, v->merge[2 * rank], l, nl) && span_eq(v, v->merge[2 * rank + 1], r, nr))
            return rank;
    }
}

/* ---- the pair queue of the merges (kv_vocab_internal.h) ---------------------------------- */

static int before(const kv_bigram *a, const kv_bigram *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

int kv_bigram_push(kv_bigram_heap *h, kv_bigram x)
{
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 64;
        kv_bigram *b = realloc(h->b, (size_t)cap * sizeof *b);
        if (!b) return -1;
        h->b = b, h->cap = cap;
    }
    int i = h->n++;
    while (i > 0 && before(&x, &h->b[(i - 1) / 2])) { /* sift up */
        h->b[i] = h->b[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->b[i] = x;
    return 0;
}

kv_bigram kv_bigram_pop(kv_bigram_heap *h)
{
    kv_bigram top = h->b[0], last = h->b[--h->n];
    int i = 0;
    for (;;) { /* sift the last element down from the root */
        int c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && before(&h->b[c + 1], &h->b[c])) c++;
        if (!before(&h->b[c], &last)) break;
        h->b[i] = h->b[c];
        i = c;
    }
    if (h->n > 0) h->b[i] = last;
    return top;
}

/* ---- building a vocabulary --------------------------------------------------------------- */

/* The pre-tokenizers kvlab has, by the names tokenizer.ggml.pre gives them (llama.cpp's
 * groups of names for the same patterns). The Llama 3 family also adds BOS and keeps a word
 * that is a whole token unmerged. */
static const struct {
    const char *name;
    int pre, ignore_merges, add_bos;
} pre_names[] = {
    {"gpt-2", KV_PRE_GPT2, 0, 0},      {"phi-2", KV_PRE_GPT2, 0, 0},
    {"mpt", KV_PRE_GPT2, 0, 0},        {"olmo", KV_PRE_GPT2, 0, 0},
    {"jais", KV_PRE_GPT2, 0, 0},       {"llama3", KV_PRE_LLAMA3, 1, 1},
    {"llama-v3", KV_PRE_LLAMA3, 1, 1}, {"llama-bpe", KV_PRE_LLAMA3, 1, 1},
    {"falcon3", KV_PRE_LLAMA3, 1, 1},  {"pixtral", KV_PRE_LLAMA3, 1, 1},
    {"dbrx", KV_PRE_LLAMA3, 0, 0},     {"smaug-bpe", KV_PRE_LLAMA3, 0, 0},
    {"smollm", KV_PRE_SMOLLM, 0, 0},   {"starcoder", KV_PRE_SMOLLM, 0, 0},
    {"refact", KV_PRE_SMOLLM, 0, 0},   {"command-r", KV_PRE_SMOLLM, 0, 0},
    {"codeshell", KV_PRE_SMOLLM, 0, 0}, {"exaone", KV_PRE_SMOLLM, 0, 0},
    {"minerva-7b", KV_PRE_SMOLLM, 0, 0}, {"qwen2", KV_PRE_QWEN2, 0, 0},
    {"deepseek-r1-qwen", KV_PRE_QWEN2, 0, 0}, {"stablelm2", KV_PRE_QWEN2, 0, 0},
    {"default", KV_PRE_DEFAULT, 0, 0}, /* also when the file names none */
};

static int set_model(kv_vocab *v, const kv_vocab_desc *d, kv_err *err)
{
    if (!d->model) return kv_fail(err, KV_ERR_FORMAT, "kv_vocab: no tokenizer.ggml.model");
    if (strcmp(d->model, "llama") == 0) {
        v->kind = KV_VOCAB_SPM;
        v->add_bos = 1, v->add_eos = 0, v->add_space_prefix = 1;
        v->bos = 1, v->eos = 2, v->unk = 0;
        return KV_OK;
    }
    if (strcmp(d->model, "gpt2") != 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "kv_vocab: tokenizer.ggml.model '%s' (kvlab has 'gpt2' and 'llama')",
                       d->model);
    v->kind = KV_VOCAB_BPE;
    v->bos = 11, v->eos = 11, v->unk = -1; /* llama.cpp's defaults for gpt2 */
    const char *pre = d->pre ? d->pre : "default";
    for (size_t i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++) {
        if (strcmp(pre, pre_names[i].name) != 0) continue;
        v->pre = pre_names[i].pre;
        v->ignore_merges = pre_names[i].ignore_merges;
        v->add_bos = pre_names[i].add_bos;
        return KV_OK;
    }
    return kv_fail(err, KV_ERR_UNSUPPORTED,
                   "kv_vocab: pre-tokenizer '%s' (tokenizer.ggml.pre): kvlab has gpt-2, "
                   "llama-bpe, qwen2, smollm, default and the names that share their patterns", pre);
}

/* a special id from the file when in range, else the default when in range, else none */
static int special_id(int given, int dflt, int n)
{
    if (given != KV_VOCAB_UNSET && given >= 0 && given < n) return given;
    return dflt >= 0 && dflt < n ? dflt : -1;
}

/* a special token to sort: longest first, then lowest id */
typedef struct {
    size_t len;
    int id;
} by_length;

static int special_cmp(const void *pa, const void *pb)
{
    const by_length *a = pa, *b = pb;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static size_t pow2_above(size_t n)
{
    size_t c = 16;
    while (c < 2 * n) c *= 2;
    return c;
}

/* copy tokens and merges into one text arena */
static int copy_text(kv_vocab *v, const kv_vocab_desc *d, kv_err *err)
{
    size_t bytes = 0;
    for (int i = 0; i < d->n_tokens; i++) bytes += d->tokens[i].n ? d->tokens[i].n : 24;
    for (int i = 0; i < d->n_merges; i++) bytes += d->merges[i].n;
    v->text = malloc(bytes + 1);
    v->tok = calloc((size_t)d->n_tokens, sizeof *v->tok);
    v->score = calloc((size_t)d->n_tokens, sizeof *v->score);
    v->type = calloc((size_t)d->n_tokens, 1);
    v->merge = calloc(2 * (size_t)d->n_merges + 1, sizeof *v->merge);
    if (!v->text || !v->tok || !v->score || !v->type || !v->merge)
        return kv_fail(err, KV_ERR_NOMEM, "kv_vocab: %d tokens", d->n_tokens);
    size_t at = 0;
    for (int i = 0; i < d->n_tokens; i++) {
        /* an empty token could never be found: llama.cpp names it [EMPTY_i] */
        if (d->tokens[i].n == 0) {
            int k = snprintf(v->text + at, 24, "[EMPTY_%d]", i);
            v->tok[i] = (kv_vocab_span){at, (size_t)k};
            at += (size_t)k;
        } else {
            memcpy(v->text + at, d->tokens[i].s, d->tokens[i].n);
            v->tok[i] = (kv_vocab_span){at, d->tokens[i].n};
            at += d->tokens[i].n;
        }
        v->score[i] = d->scores ? d->scores[i] : 0.0f;
        if (!isfinite(v->score[i]))
            return kv_fail(err, KV_ERR_FORMAT, "kv_vocab: token %d has a score that is not finite", i);
        int t = d->types ? d->types[i] : KV_TOKEN_NORMAL;
        v->type[i] = (unsigned char)(t >= 0 && t <= KV_TOKEN_BYTE ? t : KV_TOKEN_UNDEFINED);
    }
    for (int i = 0; i < d->n_merges; i++) {
        /* "left right", split at the first space after the first byte (a left half may be a
         * space itself); a merge without one can never apply and stays empty */
        const char *s = d->merges[i].s;
        size_t n = d->merges[i].n, sp = 1;
        while (sp < n && s[sp] != ' ') sp++;
        memcpy(v->text + at, s, n);
        if (sp < n) {
            v->merge[2 * i] = (kv_vocab_span){at, sp};
            v->merge[2 * i + 1] = (kv_vocab_span){at + sp + 1, n - sp - 1};
        }
        at += n;
    }
    return KV_OK;
}

static int build_tables(kv_vocab *v, kv_err *err)
{
    v->tok_cap = pow2_above((size_t)v->n);
    v->tok_slot = calloc(v->tok_cap, sizeof *v->tok_slot);
    v->merge_cap = v->n_merges ? pow2_above((size_t)v->n_merges) : 0;
    v->merge_slot = v->merge_cap ? calloc(v->merge_cap, sizeof *v->merge_slot) : NULL;
    v->special = malloc(((size_t)v->n + 1) * sizeof *v->special);
    if (!v->tok_slot || (v->merge_cap && !v->merge_slot) || !v->special)
        return kv_fail(err, KV_ERR_NOMEM, "kv_vocab: lookup tables");
    for (int id = 0; id < v->n; id++) {
        const char *s = v->text + v->tok[id].off;
        size_t n = v->tok[id].len, mask = v->tok_cap - 1;
        if (kv_vocab_lookup(v, s, n) >= 0)
            return kv_fail(err, KV_ERR_FORMAT, "kv_vocab: token %d repeats token %d ('%.*s')",
                           id, kv_vocab_lookup(v, s, n), (int)(n < 40 ? n : 40), s);
        size_t i = kv_vocab_hash(s, n, KV_VOCAB_HASH_SEED) & mask;
        while (v->tok_slot[i]) i = (i + 1) & mask;
        v->tok_slot[i] = id + 1;
    }
    for (int r = 0; r < v->n_merges; r++) {
        kv_vocab_span l = v->merge[2 * r], rt = v->merge[2 * r + 1];
        if (l.len == 0) continue; /* no space in it */
        const char *ls = v->text + l.off, *rs = v->text + rt.off;
        if (kv_vocab_merge_rank(v, ls, l.len, rs, rt.len) >= 0) continue; /* the first wins */
        size_t mask = v->merge_cap - 1, i = merge_hash(ls, l.len, rs, rt.len) & mask;
        while (v->merge_slot[i]) i = (i + 1) & mask;
        v->merge_slot[i] = r + 1;
    }
    /* the special tokens, longest first: a longer one is cut out before a shorter one inside
     * it can be (llama.cpp sorts by length alone; equal lengths go by id here) */
    by_length *sp = malloc(((size_t)v->n + 1) * sizeof *sp);
    if (!sp) return kv_fail(err, KV_ERR_NOMEM, "kv_vocab: special tokens");
    v->n_special = 0;
    for (int id = 0; id < v->n; id++) {
        int t = v->type[id];
        if (t == KV_TOKEN_CONTROL || t == KV_TOKEN_USER_DEFINED || t == KV_TOKEN_UNKNOWN)
            sp[v->n_special++] = (by_length){v->tok[id].len, id};
    }
    qsort(sp, (size_t)v->n_special, sizeof *sp, special_cmp);
    for (int k = 0; k < v->n_special; k++) v->special[k] = sp[k].id;
    free(sp);
    return KV_OK;
}

int kv_vocab_create(const kv_vocab_desc *d, kv_vocab **out, kv_err *err)
{
    if (!out) return kv_fail(err, KV_ERR_ARG, "kv_vocab_create: out is NULL");
    *out = NULL;
    if (!d) return kv_fail(err, KV_ERR_ARG, "kv_vocab_create: no description");
    if (d->n_tokens <= 0 || d->n_tokens > KV_VOCAB_MAX_TOKENS || !d->tokens)
        return kv_fail(err, KV_ERR_FORMAT, "kv_vocab: %d tokens (1..%d)", d->n_tokens,
                       KV_VOCAB_MAX_TOKENS);
    if (d->n_merges < 0 || d->n_merges > KV_VOCAB_MAX_MERGES || (d->n_merges && !d->merges))
        return kv_fail(err, KV_ERR_FORMAT, "kv_vocab: %d merges", d->n_merges);
    kv_vocab *v = calloc(1, sizeof *v);
    if (!v) return kv_fail(err, KV_ERR_NOMEM, "kv_vocab: the vocabulary");
    int st = set_model(v, d, err);
    if (!st && v->kind == KV_VOCAB_BPE && d->n_merges == 0)
        st = kv_fail(err, KV_ERR_FORMAT, "kv_vocab: a gpt2 tokenizer without tokenizer.ggml.merges");
    v->n = d->n_tokens;
    v->n_merges = v->kind == KV_VOCAB_BPE ? d->n_merges : 0;
    if (!st) st = copy_text(v, d, err);
    if (!st) st = build_tables(v, err);
    if (st) {
        kv_vocab_free(v);
        return st;
    }
    v->bos = special_id(d->bos, v->bos, v->n);
    v->eos = special_id(d->eos, v->eos, v->n);
    v->unk = special_id(d->unk, v->unk, v->n);
    if (d->add_bos != KV_VOCAB_UNSET) v->add_bos = d->add_bos != 0;
    if (d->add_eos != KV_VOCAB_UNSET) v->add_eos = d->add_eos != 0;
    if (d->add_space_prefix != KV_VOCAB_UNSET) v->add_space_prefix = d->add_space_prefix != 0;
    *out = v;
    return KV_OK;
}

void kv_vocab_free(kv_vocab *v)
{
    if (!v) return;
    free(v->text);
    free(v->tok);
    free(v->score);
    free(v->type);
    free(v->tok_slot);
    free(v->merge);
    free(v->merge_slot);
    free(v->special);
    free(v);
}

/* ---- encoding ---------------------------------------------------------------------------- */

/* a piece of the text: a token already (id >= 0), or bytes [off, off + len) still to encode */
typedef struct {
    int id;
    size_t off, len;
} fragment;

/* first occurrence of the n bytes of s in t[0..tn), or NULL */
static const char *find_bytes(const char *t, size_t tn, const char *s, size_t n)
{
    for (size_t i = 0; n <= tn && i <= tn - n; i++)
        if (t[i] == s[0] && memcmp(t + i, s, n) == 0) return t + i;
    return NULL;
}

/* a list of fragments, grown as special tokens are found */
typedef struct {
    fragment *f;
    int n, cap;
} fragments;

static int push(fragments *l, fragment x)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        fragment *f = realloc(l->f, (size_t)cap * sizeof *f);
        if (!f) return -1;
        l->f = f, l->cap = cap;
    }
    l->f[l->n++] = x;
    return 0;
}

/* step 1: cut one special token out of every text fragment of a into b */
static int cut_special(const kv_vocab *v, int id, const char *text, const fragments *a,
                       fragments *b)
{
    const char *s = v->text + v->tok[id].off;
    size_t n = v->tok[id].len;
    b->n = 0;
    for (int i = 0; i < a->n; i++) {
        const fragment *f = &a->f[i];
        if (f->id >= 0) {
            if (push(b, *f)) return -1;
            continue;
        }
        size_t at = f->off, end = f->off + f->len;
        const char *m;
        while ((m = find_bytes(text + at, end - at, s, n))) {
            size_t pos = (size_t)(m - text);
            if (pos > at && push(b, (fragment){-1, at, pos - at})) return -1;
            if (push(b, (fragment){id, pos, n})) return -1;
            at = pos + n;
        }
        if (at < end && push(b, (fragment){-1, at, end - at})) return -1;
    }
    return 0;
}

int kv_vocab_encode(const kv_vocab *v, const char *text, size_t len, int add_bos, int special,
                    int *ids, int cap, int *n, kv_err *err)
{
    if (n) *n = 0;
    if (!v || !n || (len && !text) || cap < 0 || (cap && !ids))
        return kv_fail(err, KV_ERR_ARG, "kv_vocab_encode: a NULL argument or a negative cap");
    if (len > KV_VOCAB_MAX_TEXT)
        return kv_fail(err, KV_ERR_ARG, "kv_vocab_encode: %zu bytes of text (at most %d a call)",
                       len, KV_VOCAB_MAX_TEXT);
    fragments a = {NULL, 0, 0}, b = {NULL, 0, 0};
    int status = KV_OK;
    if (len > 0 && push(&a, (fragment){-1, 0, len})) status = KV_ERR_NOMEM;
    for (int k = 0; k < v->n_special && !status; k++) {
        int id = v->special[k];
        if (!special && v->type[id] != KV_TOKEN_USER_DEFINED) continue;
        if (cut_special(v, id, text, &a, &b)) status = KV_ERR_NOMEM;
        fragments t = a;
        a = b, b = t;
    }
    if (status) {
        free(a.f), free(b.f);
        return kv_fail(err, KV_ERR_NOMEM, "kv_vocab_encode: the special tokens of %zu bytes", len);
    }
    /* step 2 */
    kv_vocab_out out = {ids, cap, 0};
    int after_special = 1; /* the text's start counts as after a special token */
    if (add_bos && v->add_bos && v->bos >= 0) kv_vocab_emit(&out, v->bos);
    for (int i = 0; i < a.n && status == KV_OK; i++) {
        const fragment *f = &a.f[i];
        if (f->id >= 0) {
            kv_vocab_emit(&out, f->id);
            after_special = 1;
            continue;
        }
        if (v->kind == KV_VOCAB_SPM)
            status = kv_vocab_spm_encode(v, text + f->off, f->len,
                                         v->add_space_prefix && after_special, &out, err);
        else
            status = kv_vocab_bpe_encode(v, text + f->off, f->len, &out, err);
        after_special = 0;
    }
    if (add_bos && v->add_eos && v->eos >= 0) kv_vocab_emit(&out, v->eos);
    free(a.f);
    free(b.f);
    if (status) return status;
    *n = out.n;
    if (out.n > cap)
        return kv_fail(err, KV_ERR_CAPACITY, "kv_vocab_encode: %d ids, room for %d", out.n, cap);
    return KV_OK;
}

/* ---- decoding and the small queries ------------------------------------------------------ */

/* append n bytes to buf (room cap) at *at, counting past cap */
static void put(char *buf, int cap, int *at, const void *s, int n)
{
    for (int i = 0; i < n; i++, (*at)++)
        if (*at < cap) buf[*at] = ((const char *)s)[i];
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

int kv_vocab_piece(const kv_vocab *v, int id, char *buf, int cap)
{
    if (!v || id < 0 || id >= v->n) return -1;
    if (!buf) cap = 0;
    const char *s = v->text + v->tok[id].off;
    int n = (int)v->tok[id].len, at = 0;
    switch (v->type[id]) {
    case KV_TOKEN_CONTROL:
    case KV_TOKEN_USER_DEFINED:
    case KV_TOKEN_UNKNOWN: put(buf, cap, &at, s, n); break; /* their text, as written */
    case KV_TOKEN_BYTE:
        if (n == 6 && memcmp(s, "<0x", 3) == 0 && hex_digit(s[3]) >= 0 && hex_digit(s[4]) >= 0) {
            char byte = (char)(hex_digit(s[3]) * 16 + hex_digit(s[4]));
            put(buf, cap, &at, &byte, 1);
        } else {
            put(buf, cap, &at, s, n);
        }
        break;
    case KV_TOKEN_NORMAL:
        for (int i = 0; i < n;) {
            int used;
            uint32_t c = kv_utf8_read((const unsigned char *)s + i, (size_t)(n - i), &used);
            int byte = v->kind == KV_VOCAB_BPE ? kv_gpt2_char_byte(c) : -1;
            if (v->kind == KV_VOCAB_SPM && c == 0x2581) byte = ' '; /* "▁" */
            if (byte >= 0) {
                char b = (char)byte;
                put(buf, cap, &at, &b, 1);
            } else {
                put(buf, cap, &at, s + i, used); /* not a mapped character: its bytes */
            }
            i += used;
        }
        break;
    default: break; /* unused and undefined tokens decode to nothing, as in llama.cpp */
    }
    return at;
}

int kv_vocab_size(const kv_vocab *v) { return v ? v->n : 0; }
int kv_vocab_bos(const kv_vocab *v) { return v ? v->bos : -1; }
int kv_vocab_eos(const kv_vocab *v) { return v ? v->eos : -1; }

int kv_vocab_find(const kv_vocab *v, const char *token_text)
{
    if (!v || !token_text) return -1;
    return kv_vocab_lookup(v, token_text, strlen(token_text));
}

int kv_vocab_is_control(const kv_vocab *v, int id)
{
    if (!v || id < 0 || id >= v->n) return 0;
    return v->type[id] == KV_TOKEN_CONTROL || v->type[id] == KV_TOKEN_USER_DEFINED;
}
