/*
 * llama2.c's tokenizer (kv_tokenizer.h): read/write tokenizer.bin, the embedded byte-level
 * vocabulary, and encode/decode with llama2.c's semantics:
 *
 *   encode  1. a "dummy prefix" space before non-empty text (sentencepiece's add_dummy_prefix),
 *           2. one token per UTF-8 codepoint when the vocabulary has it, else one byte-fallback
 *              token <0xXX> per byte,
 *           3. repeatedly merge the adjacent pair whose concatenation is the vocabulary token
 *              with the highest score (leftmost on ties), until no pair merges.
 *   decode  a token's bytes; the space after BOS is dropped, <0xXX> becomes the byte.
 *
 * Step 3 is written with a priority queue of candidate pairs instead of llama2.c's rescan of
 * the whole sequence after every merge: same merges in the same order, but O(n log n) rather
 * than O(n^2), which matters for the long prompts of the needle tests.
 * Byte-fallback and special tokens (<unk>, <s>, </s>) are never the result of a merge, so text
 * that happens to spell "<0x41>" stays text.
 */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64
#include "kv_tokenizer.h"
#include "kv_file.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KV_TOK_BOS 1
#define KV_TOK_EOS 2
#define KV_TOK_MAX_VOCAB (1 << 24)
#define KV_TOK_MAX_LEN 65536 /* longest token a tokenizer.bin may declare */

/* One row of the lookup table: tokens sorted by their bytes, then by id. */
typedef struct {
    const char *str;
    int len;
    int id;
} kv_tok_entry;

static int bytes_cmp(const char *a, int la, const char *b, int lb)
{
    int n = la < lb ? la : lb;
    int c = memcmp(a, b, (size_t)n);
    if (c) return c;
    return (la > lb) - (la < lb);
}

static int entry_cmp(const void *pa, const void *pb)
{
    const kv_tok_entry *a = pa, *b = pb;
    int c = bytes_cmp(a->str, a->len, b->str, b->len);
    return c ? c : (a->id > b->id) - (a->id < b->id);
}

/* id of the token with exactly these bytes (the lowest id if several), or -1 */
static int lookup(const kv_tokenizer *t, const char *s, int len)
{
    const kv_tok_entry *e = t->sorted;
    int lo = 0, hi = t->vocab_size; /* first entry >= s */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (bytes_cmp(e[mid].str, e[mid].len, s, len) < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo < t->vocab_size && bytes_cmp(e[lo].str, e[lo].len, s, len) == 0) return e[lo].id;
    return -1;
}

/* byte value of a "<0xXX>" token, or -1 */
static int byte_token_value(const char *s, int len)
{
    if (len != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        int c = (unsigned char)s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Sort the vocabulary for lookup and find the 256 byte-fallback tokens. */
static int build_index(kv_tokenizer *t, kv_err *err)
{
    kv_tok_entry *e = malloc(sizeof *e * (size_t)t->vocab_size); /* [vocab_size] */
    if (!e) return kv_fail(err, KV_ERR_NOMEM, "cannot allocate the tokenizer index");
    for (int i = 0; i < t->vocab_size; i++) e[i] = (kv_tok_entry){t->vocab[i], t->lengths[i], i};
    qsort(e, (size_t)t->vocab_size, sizeof *e, entry_cmp);
    t->sorted = e;
    /* byte fallback needs <0x00>..<0xFF> at consecutive ids (3..258 in llama2.c vocabularies) */
    t->byte_base = lookup(t, "<0x00>", 6);
    if (t->byte_base >= 0) {
        if (t->byte_base + 256 > t->vocab_size) {
            t->byte_base = -1;
        } else {
            for (int b = 0; b < 256; b++) {
                int id = t->byte_base + b;
                if (byte_token_value(t->vocab[id], t->lengths[id]) != b) {
                    t->byte_base = -1;
                    break;
                }
            }
        }
    }
    return KV_OK;
}

void kv_tokenizer_free(kv_tokenizer *t)
{
    if (!t) return;
    if (t->vocab)
        for (int i = 0; i < t->vocab_size; i++) free(t->vocab[i]);
    free(t->vocab);
    free(t->lengths);
    free(t->scores);
    free(t->sorted);
    memset(t, 0, sizeof *t);
}

static int alloc_arrays(kv_tokenizer *t, int vocab_size, kv_err *err)
{
    memset(t, 0, sizeof *t);
    t->byte_base = -1;
    t->vocab = calloc((size_t)vocab_size, sizeof *t->vocab);     /* [vocab_size] */
    t->lengths = calloc((size_t)vocab_size, sizeof *t->lengths); /* [vocab_size] */
    t->scores = calloc((size_t)vocab_size, sizeof *t->scores);   /* [vocab_size] */
    t->vocab_size = vocab_size;
    if (!t->vocab || !t->lengths || !t->scores) {
        kv_tokenizer_free(t);
        return kv_fail(err, KV_ERR_NOMEM, "cannot allocate a vocabulary of %d tokens", vocab_size);
    }
    return KV_OK;
}

/* store token i as a NUL-terminated copy of len bytes */
static int set_token(kv_tokenizer *t, int i, const char *s, int len, float score)
{
    char *p = malloc((size_t)len + 1);
    if (!p) return 0;
    memcpy(p, s, (size_t)len);
    p[len] = '\0';
    t->vocab[i] = p;
    t->lengths[i] = len;
    t->scores[i] = score;
    if (len > t->max_token_length) t->max_token_length = len;
    return 1;
}

/* ----------------------------------------------------------------------------
 * File I/O
 */

int kv_tokenizer_read(const char *path, int vocab_size, kv_tokenizer *t, kv_err *err)
{
    if (!t) return kv_fail(err, KV_ERR_ARG, "tokenizer is NULL");
    memset(t, 0, sizeof *t);
    if (!path) return kv_fail(err, KV_ERR_ARG, "tokenizer path is NULL");
    /* tokenizer.bin does not store its size; it comes from the model's header */
    if (vocab_size < 1 || vocab_size > KV_TOK_MAX_VOCAB)
        return kv_fail(err, KV_ERR_ARG, "vocab_size (%d) must be in 1..%d", vocab_size,
                       KV_TOK_MAX_VOCAB);
    FILE *f;
    int rc = kv_file_open_read(path, 0, &f, NULL, err); /* vocab_size caps what is read */
    if (rc) return rc;
    rc = alloc_arrays(t, vocab_size, err);
    if (rc) {
        fclose(f);
        return rc;
    }
    int32_t max_len;
    char *buf = NULL;
    if (fread(&max_len, 4, 1, f) != 1) {
        rc = kv_fail(err, KV_ERR_FORMAT, "'%s' is truncated: no max_token_length header", path);
        goto done;
    }
    if (max_len < 1 || max_len > KV_TOK_MAX_LEN) {
        rc = kv_fail(err, KV_ERR_FORMAT, "'%s': max_token_length (%d) must be in 1..%d", path,
                     (int)max_len, KV_TOK_MAX_LEN);
        goto done;
    }
    buf = malloc((size_t)max_len + 1); /* [max_token_length] one token's bytes */
    if (!buf) {
        rc = kv_fail(err, KV_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < vocab_size; i++) {
        float score;
        int32_t len;
        if (fread(&score, 4, 1, f) != 1 || fread(&len, 4, 1, f) != 1) {
            rc = kv_fail(err, KV_ERR_FORMAT, "'%s' is truncated at token %d of %d", path, i,
                         vocab_size);
            goto done;
        }
        if (!isfinite(score)) {
            rc = kv_fail(err, KV_ERR_FORMAT, "'%s': score of token %d is %s", path, i,
                         isnan(score) ? "NaN" : "infinite");
            goto done;
        }
        if (len < 0 || len > max_len) {
            rc = kv_fail(err, KV_ERR_FORMAT,
                         "'%s': token %d has length %d, outside 0..max_token_length (%d)", path,
                         i, (int)len, (int)max_len);
            goto done;
        }
        if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
            rc = kv_fail(err, KV_ERR_FORMAT, "'%s' is truncated in the bytes of token %d of %d",
                         path, i, vocab_size);
            goto done;
        }
        if (!set_token(t, i, buf, len, score)) {
            rc = kv_fail(err, KV_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    if (fgetc(f) != EOF) {
        rc = kv_fail(err, KV_ERR_FORMAT,
                     "'%s' has trailing bytes after %d tokens (does vocab_size %d match the model?)",
                     path, vocab_size, vocab_size);
        goto done;
    }
    t->max_token_length = max_len;
    rc = build_index(t, err);
done:
    free(buf);
    fclose(f);
    if (rc) kv_tokenizer_free(t);
    return rc;
}

int kv_tokenizer_write(const char *path, const kv_tokenizer *t, kv_err *err)
{
    if (!path || !t || !t->vocab) return kv_fail(err, KV_ERR_ARG, "no path or no tokenizer");
    for (int i = 0; i < t->vocab_size; i++)
        if (t->lengths[i] > t->max_token_length || t->lengths[i] < 0)
            return kv_fail(err, KV_ERR_ARG, "token %d has length %d, outside 0..max_token_length (%d)",
                           i, t->lengths[i], t->max_token_length);
    /* temporary file + rename, as for checkpoints (kv_file.h): no half-written tokenizer.bin */
    kv_file_out o;
    int rc = kv_file_create(path, &o, err);
    if (rc) return rc;
    int32_t max_len = t->max_token_length;
    int ok = fwrite(&max_len, 4, 1, o.f) == 1;
    for (int i = 0; i < t->vocab_size && ok; i++) {
        int32_t len = t->lengths[i];
        ok = fwrite(&t->scores[i], 4, 1, o.f) == 1 && fwrite(&len, 4, 1, o.f) == 1 &&
             fwrite(t->vocab[i], 1, (size_t)len, o.f) == (size_t)len;
    }
    if (!ok) {
        rc = kv_fail(err, KV_ERR_IO, "writing '%s' failed: %s", path, strerror(errno));
        kv_file_abort(&o);
        return rc;
    }
    return kv_file_commit(&o, err);
}

/* ----------------------------------------------------------------------------
 * The embedded vocabulary
 *
 *   0..2      <unk>, "\n<s>\n", "\n</s>\n"         (llama2.c's special token strings)
 *   3..258    <0x00> .. <0xFF>                    byte fallback
 *   259..353  the 95 printable ASCII characters   what step 2 of encode finds
 *   354..     merged pairs: common English pairs first, then every other pair of printable
 *             characters in byte order; past those, longer tokens (a token of the previous
 *             length + one character), so any vocab_size can be filled.
 * Merged tokens score -(rank): earlier ones merge first. Everything else scores 0.
 */
static const char *const kv_common_pairs[] = {
    " t", " a", "th", "he", "in", "er", "an", " s", " o", " w", "re", "on", " i", "nd",
    "at", "en", "ed", "ou", " b", " c", "ha", "is", "es", "it", "or", "ng", "to", "ar",
    "te", "st", " h", " m", " f", " d", "hi", "as", "le", "of", "al", "ve", "me", "se",
    " T", " I", " l", " p", " n", " r", " g", " y", "ll", "nt", "ea", "ne", "ro", "ri",
};

int kv_tokenizer_bytes(kv_tokenizer *t, int vocab_size, kv_err *err)
{
    if (!t) return kv_fail(err, KV_ERR_ARG, "tokenizer is NULL");
    memset(t, 0, sizeof *t);
    if (vocab_size < 259 || vocab_size > KV_TOK_MAX_VOCAB)
        return kv_fail(err, KV_ERR_ARG,
                       "vocab_size (%d) must be in 259..%d: the byte tokenizer needs 3 special "
                       "and 256 byte tokens", vocab_size, KV_TOK_MAX_VOCAB);
    int rc = alloc_arrays(t, vocab_size, err);
    if (rc) return rc;
    int n = 0, ok = 1;
    char s[16];
    ok = ok && set_token(t, n++, "<unk>", 5, 0.0f);
    ok = ok && set_token(t, n++, "\n<s>\n", 5, 0.0f);
    ok = ok && set_token(t, n++, "\n</s>\n", 6, 0.0f);
    for (int b = 0; b < 256 && ok; b++) {
        snprintf(s, sizeof s, "<0x%02X>", b);
        ok = set_token(t, n++, s, 6, 0.0f);
    }
    const int first_single = n;
    for (int c = 0x20; c <= 0x7E && n < vocab_size && ok; c++) {
        s[0] = (char)c;
        ok = set_token(t, n++, s, 1, 0.0f);
    }
    const int n_singles = n - first_single;
    int rank = 0;
    /* pairs: the common list, then the rest in byte order (seen[] avoids repeats) */
    unsigned char seen[95][95] = {{0}};
    const int n_common = (int)(sizeof kv_common_pairs / sizeof kv_common_pairs[0]);
    const int first_pair = n;
    for (int i = 0; i < n_common && n < vocab_size && ok; i++) {
        const char *p = kv_common_pairs[i];
        seen[p[0] - 0x20][p[1] - 0x20] = 1;
        ok = set_token(t, n++, p, 2, -(float)rank++);
    }
    for (int a = 0; a < 95 && n < vocab_size && ok; a++)
        for (int b = 0; b < 95 && n < vocab_size && ok; b++) {
            if (seen[a][b]) continue;
            s[0] = (char)(0x20 + a);
            s[1] = (char)(0x20 + b);
            ok = set_token(t, n++, s, 2, -(float)rank++);
        }
    /* longer tokens: every token of the previous length, extended by each character */
    int level_start = first_pair, level_end = n, len = 2;
    while (n < vocab_size && ok && len < 15) {
        for (int i = level_start; i < level_end && n < vocab_size && ok; i++)
            for (int c = 0; c < n_singles && n < vocab_size && ok; c++) {
                memcpy(s, t->vocab[i], (size_t)len);
                s[len] = (char)(0x20 + c);
                ok = set_token(t, n++, s, len + 1, -(float)rank++);
            }
        level_start = level_end;
        level_end = n;
        len++;
    }
    if (!ok) {
        kv_tokenizer_free(t);
        return kv_fail(err, KV_ERR_NOMEM, "out of memory building the byte tokenizer");
    }
    if ((rc = build_index(t, err))) kv_tokenizer_free(t);
    return rc;
}

/* ----------------------------------------------------------------------------
 * Encode
 */

/* A candidate merge: tokens at list positions left and next(left) -> merged. */
typedef struct {
    float score;
    int left;              /* position (in the initial sequence) of the left token */
    int left_id, right_id; /* the tokens the candidate was made from, to spot stale entries */
    int merged;
} kv_merge;

/* heap order: higher score first; on equal scores the leftmost pair (llama2.c's scan order) */
static int merge_before(const kv_merge *a, const kv_merge *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(kv_merge *h, int *n, kv_merge e)
{
    int i = (*n)++;
    while (i > 0 && merge_before(&e, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static kv_merge heap_pop(kv_merge *h, int *n)
{
    kv_merge top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_before(&h[c + 1], &h[c])) c++;
        if (!merge_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* the token whose bytes are a's followed by b's, if it may be a merge result; else -1 */
static int merge_id(const kv_tokenizer *t, int a, int b, char *buf)
{
    int la = t->lengths[a], lb = t->lengths[b];
    if (la + lb > t->max_token_length) return -1; /* no token is that long */
    memcpy(buf, t->vocab[a], (size_t)la);
    memcpy(buf + la, t->vocab[b], (size_t)lb);
    int id = lookup(t, buf, la + lb);
    if (id < 3) return -1; /* not found, or a special token */
    if (t->byte_base >= 0 && id >= t->byte_base && id < t->byte_base + 256) return -1;
    return id;
}

/* the byte-fallback token of byte b, or -1 */
static int byte_token(const kv_tokenizer *t, unsigned char b)
{
    return t->byte_base >= 0 ? t->byte_base + b : -1;
}

int kv_tokenizer_encode(const kv_tokenizer *t, const char *text, int bos, int eos, int *tokens,
                        int *n, kv_err *err)
{
    if (n) *n = 0;
    if (!t || !t->sorted || !text || !tokens || !n)
        return kv_fail(err, KV_ERR_ARG, "encode needs a loaded tokenizer, text, tokens and n");
    if ((bos || eos) && t->vocab_size <= KV_TOK_EOS)
        return kv_fail(err, KV_ERR_ARG, "vocabulary of %d tokens has no BOS/EOS ids",
                       t->vocab_size);
    int cnt = 0;
    if (bos) tokens[cnt++] = KV_TOK_BOS;

    /* 1. the dummy prefix: sentencepiece encodes "hello" as if it were " hello" */
    if (text[0] != '\0') {
        int id = lookup(t, " ", 1);
        if (id < 0) id = byte_token(t, ' ');
        if (id < 0) return kv_fail(err, KV_ERR_ARG, "vocabulary has no token for ' '");
        tokens[cnt++] = id;
    }

    /* 2. one token per UTF-8 codepoint: a lead byte and up to 3 continuation bytes
     *    (10xxxxxx); malformed input simply ends up as byte tokens */
    for (const unsigned char *c = (const unsigned char *)text; *c;) {
        int len = 1;
        while (len < 4 && (c[len] & 0xC0) == 0x80) len++;
        int id = lookup(t, (const char *)c, len);
        if (id >= 0) {
            tokens[cnt++] = id;
        } else {
            for (int i = 0; i < len; i++) {
                int b = byte_token(t, c[i]);
                if (b < 0)
                    return kv_fail(err, KV_ERR_ARG,
                                   "no token for byte 0x%02X and the vocabulary has no <0xXX> "
                                   "byte tokens", c[i]);
                tokens[cnt++] = b;
            }
        }
        c += len;
    }

    /* 3. greedy merges. The sequence is a linked list over positions 0..cnt-1 (a merged-away
     *    token has id -1); the heap holds every adjacent pair that names a vocabulary token.
     *    A popped pair whose tokens have changed since it was pushed is stale and skipped. */
    if (cnt > 1) {
        int *next = malloc(sizeof(int) * (size_t)cnt);      /* [cnt] following position, -1 at end */
        int *prev = malloc(sizeof(int) * (size_t)cnt);      /* [cnt] preceding position, -1 at start */
        kv_merge *heap = malloc(sizeof(kv_merge) * 3 * (size_t)cnt); /* cnt-1 pairs + 2 per merge */
        char *buf = malloc(2 * (size_t)t->max_token_length + 1);
        if (!next || !prev || !heap || !buf) {
            free(next); free(prev); free(heap); free(buf);
            return kv_fail(err, KV_ERR_NOMEM, "out of memory encoding %d tokens", cnt);
        }
        int nh = 0;
        for (int i = 0; i < cnt; i++) {
            next[i] = i + 1 < cnt ? i + 1 : -1;
            prev[i] = i - 1;
        }
        for (int i = 0; i + 1 < cnt; i++) {
            int id = merge_id(t, tokens[i], tokens[i + 1], buf);
            if (id >= 0) heap_push(heap, &nh, (kv_merge){t->scores[id], i, tokens[i], tokens[i + 1], id});
        }
        while (nh > 0) {
            kv_merge e = heap_pop(heap, &nh);
            int r = next[e.left];
            if (tokens[e.left] != e.left_id || r < 0 || tokens[r] != e.right_id) continue;
            tokens[e.left] = e.merged; /* the pair becomes one token at the left position */
            tokens[r] = -1;
            next[e.left] = next[r];
            if (next[r] >= 0) prev[next[r]] = e.left;
            int p = prev[e.left], q = next[e.left], id;
            if (p >= 0 && (id = merge_id(t, tokens[p], tokens[e.left], buf)) >= 0)
                heap_push(heap, &nh, (kv_merge){t->scores[id], p, tokens[p], tokens[e.left], id});
            if (q >= 0 && (id = merge_id(t, tokens[e.left], tokens[q], buf)) >= 0)
                heap_push(heap, &nh, (kv_merge){t->scores[id], e.left, tokens[e.left], tokens[q], id});
        }
        int m = 0; /* compact: position 0 is never merged away, so the list starts there */
        for (int i = 0; i >= 0; i = next[i]) tokens[m++] = tokens[i];
        cnt = m;
        free(next); free(prev); free(heap); free(buf);
    }
    if (eos) tokens[cnt++] = KV_TOK_EOS;
    *n = cnt;
    return KV_OK;
}

/* ----------------------------------------------------------------------------
 * Decode
 */

const char *kv_tokenizer_decode(const kv_tokenizer *t, int prev, int token, char byte_buf[2])
{
    if (!t || token < 0 || token >= t->vocab_size) return "";
    const char *piece = t->vocab[token];
    int len = t->lengths[token];
    /* sentencepiece drops the dummy-prefix space of the first word after BOS */
    if (prev == KV_TOK_BOS && len > 0 && piece[0] == ' ') return piece + 1;
    int b = byte_token_value(piece, len);
    if (b >= 0) {
        if (prev == KV_TOK_BOS && b == ' ') return ""; /* the dummy prefix as a byte token */
        byte_buf[0] = (char)b;
        byte_buf[1] = '\0';
        return byte_buf;
    }
    return piece;
}
