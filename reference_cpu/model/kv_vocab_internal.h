/*
 * What the files of the GGUF tokenizers share (kv_vocab.c, kv_vocab_pre.c, kv_vocab_bpe.c,
 * kv_vocab_spm.c, kv_vocab_gguf.c): the vocabulary's layout, its lookups, the pair queue of the
 * merges and the output list. Private: not installed.
 */
#ifndef KV_VOCAB_INTERNAL_H
#define KV_VOCAB_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kv_vocab.h"

/* tokenizer.ggml.model */
enum { KV_VOCAB_BPE = 1, KV_VOCAB_SPM = 2 };

/* the pre-tokenizers: which patterns split the text before byte-level BPE (kv_vocab_pre.c) */
enum {
    KV_PRE_GPT2 = 1, /* GPT-2's pattern */
    KV_PRE_LLAMA3,   /* Llama 3's pattern */
    KV_PRE_QWEN2,    /* Llama 3's with one digit a word */
    KV_PRE_SMOLLM,   /* every \p{N} alone, then GPT-2's pattern (SmolLM, StarCoder, ...) */
    KV_PRE_DEFAULT   /* no pre-tokenizer named: punctuation runs, GPT-2's, numbers, threes */
};

/* bytes of one string inside kv_vocab.text */
typedef struct {
    size_t off;
    size_t len;
} kv_vocab_span;

struct kv_vocab {
    int kind;               /* KV_VOCAB_BPE or KV_VOCAB_SPM */
    int pre;                /* KV_PRE_* (BPE only) */
    int ignore_merges;      /* BPE: a word that is a token is that token, unmerged (Llama 3) */
    int n;                  /* tokens */
    char *text;             /* every token's bytes, then every merge's halves, back to back */
    kv_vocab_span *tok;     /* [n] each token's bytes */
    float *score;           /* [n] merge priority (SPM) */
    unsigned char *type;    /* [n] KV_TOKEN_* */
    int *tok_slot;          /* [tok_cap] open-addressing table: id + 1, 0 = empty */
    size_t tok_cap;         /* a power of two, >= 2n */
    int n_merges;
    kv_vocab_span *merge;   /* [n_merges][2] each merge's left and right halves */
    int *merge_slot;        /* [merge_cap] rank + 1, 0 = empty */
    size_t merge_cap;
    int *special;           /* [n_special] control, user-defined and unknown ids, longest first */
    int n_special;
    int bos, eos, unk;      /* -1 when none */
    int add_bos, add_eos, add_space_prefix;
};

/* FNV-1a over bytes: the hash of both lookup tables */
uint64_t kv_vocab_hash(const char *s, size_t n, uint64_t h);
#define KV_VOCAB_HASH_SEED 0xcbf29ce484222325ull

/* id of the token whose bytes are exactly s[0..n), or -1 */
int kv_vocab_lookup(const kv_vocab *v, const char *s, size_t n);
/* rank of the merge "left right", or -1 */
int kv_vocab_merge_rank(const kv_vocab *v, const char *l, size_t nl, const char *r, size_t nr);

/* The ids an encode produces: written while they fit in cap, all of them counted. */
typedef struct {
    int *ids;
    int cap;
    int n;
} kv_vocab_out;

static inline void kv_vocab_emit(kv_vocab_out *o, int id)
{
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

/*
 * The pair queue of both merge loops: the candidate merge of symbols left and right, whose
 * joined text is size bytes. Pops the smallest prio first (BPE: the merge's rank; SPM: minus the
 * joined token's score), the leftmost on ties: llama.cpp's order, so the same merges happen.
 */
typedef struct {
    double prio;
    int left, right;
    size_t size;
} kv_bigram;

typedef struct {
    kv_bigram *b; /* [cap] a binary heap */
    int n, cap;
} kv_bigram_heap;

int kv_bigram_push(kv_bigram_heap *h, kv_bigram b); /* 0, or -1 out of memory */
kv_bigram kv_bigram_pop(kv_bigram_heap *h);        /* h->n > 0 */

/* One symbol of a word being merged: bytes [off, off + n) of the word, in a linked list.
 * int offsets: kv_vocab_encode() takes at most KV_VOCAB_MAX_TEXT bytes, 3x that escaped. */
typedef struct {
    int off, n; /* n = 0: merged into its left neighbour */
    int prev, next;
} kv_symbol;

#define KV_VOCAB_MAX_TEXT (1 << 28) /* bytes one kv_vocab_encode() takes */

/* kv_vocab_pre.c: split codepoints cpt[0..n) into words by the vocabulary's pre-tokenizer;
 * word lengths (in codepoints) go to len[] (room for n), their count is returned */
int kv_vocab_pre_split(int pre, const uint32_t *cpt, int n, int *len, int *tmp);

/* kv_vocab_bpe.c / kv_vocab_spm.c: encode one fragment of plain text (no special tokens) */
int kv_vocab_bpe_encode(const kv_vocab *v, const char *text, size_t len, kv_vocab_out *out,
                        kv_err *err);
int kv_vocab_spm_encode(const kv_vocab *v, const char *text, size_t len, int space_prefix,
                        kv_vocab_out *out, kv_err *err);

#endif
