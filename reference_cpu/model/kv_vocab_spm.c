/*
 * SentencePiece-style BPE (tokenizer.ggml.model = "llama"): Llama 1 and 2, Mistral, ...
 *
 *   1. a space in front of the text when the vocabulary asks (add_space_prefix) and the text
 *      opens the prompt or follows a special token; then every space becomes U+2581 "▁", so
 *      that words carry their leading space as a visible character;
 *   2. one symbol per UTF-8 character (its length read from the lead byte alone, as llama.cpp
 *      does: invalid bytes are not repaired, they fall back to byte tokens in step 4);
 *   3. merge adjacent symbols, always the pair whose joined text is the token of highest score
 *      (the leftmost on ties), until no joined pair is a token;
 *   4. each symbol is then a token, or its bytes as the byte tokens <0x00>..<0xFF>.
 *
 * This is llama2.c's tokenizer (kv_tokenizer.c) with llama.cpp's rules: any token may be the
 * result of a merge (a byte token or <s> spelled out in the text included), and ties go to the
 * left.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_unicode.h"
#include "kv_vocab_internal.h"

/* queue the join of symbols left and right if it is a token */
static int add_pair(const kv_vocab *v, const char *t, kv_symbol *sym, kv_bigram_heap *h,
                    int left, int right)
{
    if (left < 0 || right < 0) return 0;
    size_t size = (size_t)(sym[left].n + sym[right].n);
    int id = kv_vocab_lookup(v, t + sym[left].off, size); /* the two are adjacent in t */
    if (id < 0) return 0;
    kv_bigram pair = {-(double)v->score[id], left, right, size};
    return kv_bigram_push(h, pair);
}

/* step 4's fallback: the byte token of one byte ("<0xXX>", else the byte itself as a token,
 * else the unknown token; llama.cpp fails there) */
static int byte_token(const kv_vocab *v, unsigned char c)
{
    static const char hex[] = "0123456789ABCDEF";
    char name[6] = {'<', '0', 'x', hex[c >> 4], hex[c & 15], '>'};
    int id = kv_vocab_lookup(v, name, sizeof name);
    if (id < 0) id = kv_vocab_lookup(v, (const char *)&c, 1);
    return id >= 0 ? id : v->unk;
}

int kv_vocab_spm_encode(const kv_vocab *v, const char *text, size_t len, int space_prefix,
                        kv_vocab_out *out, kv_err *err)
{
    /* 1. at most 3 bytes for every byte (a space becomes "▁"), one more for the prefix */
    char *t = malloc(len * 3 + 4);
    kv_symbol *sym = malloc((len * 3 + 4) * sizeof *sym); /* [n] one a byte at most */
    kv_bigram_heap heap = {NULL, 0, 0};
    int status = KV_OK;
    if (!t || !sym) {
        status = kv_fail(err, KV_ERR_NOMEM, "kv_vocab_encode: %zu bytes of text", len);
        goto done;
    }
    size_t n = 0;
    if (space_prefix) memcpy(t, "\xE2\x96\x81", 3), n = 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') memcpy(t + n, "\xE2\x96\x81", 3), n += 3;
        else t[n++] = text[i];
    }
    /* 2. symbols */
    int n_sym = 0;
    for (int off = 0; off < (int)n; n_sym++) {
        int c = kv_utf8_len((unsigned char)t[off]);
        if (c > (int)n - off) c = (int)n - off;
        sym[n_sym] = (kv_symbol){off, c, n_sym - 1, off + c == (int)n ? -1 : n_sym + 1};
        off += c;
    }
    /* 3. merges */
    for (int i = 1; i < n_sym; i++)
        if (add_pair(v, t, sym, &heap, i - 1, i)) goto nomem;
    while (heap.n > 0) {
        kv_bigram top = kv_bigram_pop(&heap);
        kv_symbol *l = &sym[top.left], *r = &sym[top.right];
        if (l->n == 0 || r->n == 0 || (size_t)(l->n + r->n) != top.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = top.left;
        if (add_pair(v, t, sym, &heap, l->prev, top.left) ||
            add_pair(v, t, sym, &heap, top.left, l->next))
            goto nomem;
    }
    /* 4. tokens */
    for (int i = 0; i >= 0 && i < n_sym; i = sym[i].next) {
        int id = kv_vocab_lookup(v, t + sym[i].off, (size_t)sym[i].n);
        if (id >= 0) {
            kv_vocab_emit(out, id);
            continue;
        }
        for (int j = 0; j < sym[i].n; j++) {
            int b = byte_token(v, (unsigned char)t[sym[i].off + j]);
            if (b >= 0) kv_vocab_emit(out, b);
        }
    }
    goto done;
nomem:
    status = kv_fail(err, KV_ERR_NOMEM, "kv_vocab_encode: the merge queue");
done:
    free(t);
    free(sym);
    free(heap.b);
    return status;
}
