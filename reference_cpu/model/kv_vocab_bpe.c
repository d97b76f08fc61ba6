/*
 * Byte-level BPE (tokenizer.ggml.model = "gpt2"): GPT-2, Llama 3, SmolLM2, Qwen2, ...
 *
 *   1. read the text as codepoints (an invalid UTF-8 byte reads as U+FFFD, as in llama.cpp);
 *   2. cut it into words with the vocabulary's pre-tokenizer (kv_vocab_pre.c);
 *   3. write each word's UTF-8 bytes as GPT-2's printable characters (kv_gpt2_byte_char()),
 *      one symbol per byte;
 *   4. merge adjacent symbols, always the pair whose merge comes first in tokenizer.ggml.merges
 *      (its rank), the leftmost on ties, until no pair of the word is a merge;
 *   5. each symbol is then a token; one that is not (a vocabulary without every byte) falls
 *      back to its bytes looked up one by one, and a byte with no token is dropped, as
 *      llama.cpp drops it.
 *
 * Merges never cross words: that is what the pre-tokenizer is for.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_unicode.h"
#include "kv_vocab_internal.h"

/* the symbols and pair queue of one word, reused from word to word */
typedef struct {
    const char *w; /* the word, GPT-2 characters */
    kv_symbol *sym;
    kv_bigram_heap heap;
} bpe_word;

/* queue the merge of symbols left and right if the vocabulary has it */
static int add_pair(const kv_vocab *v, bpe_word *b, int left, int right)
{
    if (left < 0 || right < 0) return 0;
    const kv_symbol *l = &b->sym[left], *r = &b->sym[right];
    int rank = kv_vocab_merge_rank(v, b->w + l->off, (size_t)l->n, b->w + r->off, (size_t)r->n);
    if (rank < 0) return 0;
    kv_bigram pair = {(double)rank, left, right, (size_t)(l->n + r->n)};
    return kv_bigram_push(&b->heap, pair);
}

/* steps 4 and 5 for one word of wn bytes (already GPT-2 characters) */
static int merge_word(const kv_vocab *v, bpe_word *b, size_t wn, kv_vocab_out *out)
{
    const char *w = b->w;
    int id = kv_vocab_lookup(v, w, wn);
    if (v->ignore_merges && id >= 0) { /* Llama 3: a whole word that is a token stays one */
        kv_vocab_emit(out, id);
        return 0;
    }
    int n_sym = 0;
    for (int off = 0; off < (int)wn; n_sym++) {
        int n = kv_utf8_len((unsigned char)w[off]);
        if (n > (int)wn - off) n = (int)wn - off;
        b->sym[n_sym] = (kv_symbol){off, n, n_sym - 1, off + n == (int)wn ? -1 : n_sym + 1};
        off += n;
    }
    b->heap.n = 0;
    for (int i = 1; i < n_sym; i++)
        if (add_pair(v, b, i - 1, i)) return -1;
    while (b->heap.n > 0) {
        kv_bigram top = kv_bigram_pop(&b->heap);
        kv_symbol *l = &b->sym[top.left], *r = &b->sym[top.right];
        /* stale: one side was merged away or grew since the pair was queued. Symbols only
         * grow to the right, so equal lengths mean the same text */
        if (l->n == 0 || r->n == 0 || (size_t)(l->n + r->n) != top.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) b->sym[r->next].prev = top.left;
        if (add_pair(v, b, l->prev, top.left) || add_pair(v, b, top.left, l->next)) return -1;
    }
    for (int i = 0; i >= 0 && i < n_sym; i = b->sym[i].next) {
        const kv_symbol *s = &b->sym[i];
        id = kv_vocab_lookup(v, w + s->off, (size_t)s->n);
        if (id >= 0) {
            kv_vocab_emit(out, id);
            continue;
        }
        for (int j = 0; j < s->n; j++) { /* step 5's fallback */
            int byte_id = kv_vocab_lookup(v, w + s->off + j, 1);
            if (byte_id >= 0) kv_vocab_emit(out, byte_id);
        }
    }
    return 0;
}

int kv_vocab_bpe_encode(const kv_vocab *v, const char *text, size_t len, kv_vocab_out *out,
                        kv_err *err)
{
    const unsigned char *t = (const unsigned char *)text;
    uint32_t *cpt = malloc((len + 1) * sizeof *cpt);         /* [len] at most one codepoint a byte */
    int *words = malloc((len + 1) * 2 * sizeof *words);     /* [2][len] word lengths, scratch */
    bpe_word b = {NULL, NULL, {NULL, 0, 0}};
    char *w = NULL;
    int status = KV_OK;
    if (!cpt || !words) goto nomem;
    /* 1. codepoints */
    int n = 0;
    for (size_t i = 0; i < len;) {
        int used;
        cpt[n++] = kv_utf8_read(t + i, len - i, &used);
        i += (size_t)used;
    }
    /* 2. words; room for the longest: a codepoint is at most 4 bytes, a byte's GPT-2
     * character at most 2, one symbol a byte */
    int n_words = kv_vocab_pre_split(v->pre, cpt, n, words, words + len + 1), longest = 0;
    for (int k = 0; k < n_words; k++) longest = words[k] > longest ? words[k] : longest;
    b.w = w = malloc((size_t)longest * 8 + 1);
    b.sym = malloc(((size_t)longest * 4 + 1) * sizeof *b.sym);
    if (!w || !b.sym) goto nomem;
    for (int k = 0, first = 0; k < n_words; first += words[k++]) {
        /* 3. the word's bytes as GPT-2 characters (a codepoint is at most 4 bytes, a
         * character at most 2) */
        size_t wn = 0;
        for (int c = first; c < first + words[k]; c++) {
            unsigned char u8[4];
            int nb = kv_utf8_write(cpt[c], u8);
            for (int j = 0; j < nb; j++) wn += (size_t)kv_utf8_write(kv_gpt2_byte_char(u8[j]),
                                                                     (unsigned char *)w + wn);
        }
        /* 4, 5 */
        if (merge_word(v, &b, wn, out)) goto nomem;
    }
    goto done;
nomem:
    status = kv_fail(err, KV_ERR_NOMEM, "kv_vocab_encode: %zu bytes of text", len);
done:
    free(cpt);
    free(words);
    free(w);
    free(b.sym);
    free(b.heap.b);
    return status;
}
