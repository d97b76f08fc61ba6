/**
 * @file kv_tokenizer.h
 * llama2.c's tokenizer.bin: BPE by merge score with byte fallback (<0x00>..<0xFF>).
 *
 * File: int32 max_token_length, then for each of vocab_size tokens: float32 score,
 * int32 length, that many bytes (no terminator). vocab_size comes from the model.
 */
#ifndef KV_TOKENIZER_H
#define KV_TOKENIZER_H

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int vocab_size;
    int max_token_length;
    char **vocab;      /* [vocab_size] NUL-terminated token strings */
    int *lengths;      /* [vocab_size] byte length (tokens may contain NUL bytes) */
    float *scores;     /* [vocab_size] merge priority */
    void *sorted;      /* lookup table for encode, owned */
    int byte_base;     /* id of <0x00>, or -1 when the vocabulary has no byte tokens */
} kv_tokenizer;

/**
 * Read tokenizer.bin holding exactly @p vocab_size tokens (the model's vocab_size; the file
 * does not store it). Truncation, trailing bytes, a length outside 0..max_token_length or a
 * non-finite score -> KV_ERR_FORMAT naming the token index; @p t is left zeroed on failure.
 */
int kv_tokenizer_read(const char *path, int vocab_size, kv_tokenizer *t, kv_err *err);
/** Write tokenizer.bin (via a temporary file and rename, like checkpoints). */
int kv_tokenizer_write(const char *path, const kv_tokenizer *t, kv_err *err);
/** Free everything (safe on a zeroed struct). */
void kv_tokenizer_free(kv_tokenizer *t);

/**
 * The embedded byte-level tokenizer: `<unk>`, `<s>`, `</s>`, then <0x00>..<0xFF> (ids 3..258),
 * then the 95 printable ASCII characters (ids 259..353, what encode's codepoint step finds),
 * then ids up to vocab_size filled with deterministic merged pairs of printable bytes (common
 * English pairs first), then longer merges if vocab_size asks for more. vocab_size >= 259.
 */
int kv_tokenizer_bytes(kv_tokenizer *t, int vocab_size, kv_err *err);

/**
 * Encode text (llama2.c semantics: dummy-prefix space, UTF-8 codepoints, byte fallback,
 * greedy highest-score merges); bos/eos add ids 1/2. tokens must hold strlen(text)+3;
 * count in *n.
 */
int kv_tokenizer_encode(const kv_tokenizer *t, const char *text, int bos, int eos, int *tokens,
                        int *n, kv_err *err);
/**
 * Text of @p token following @p prev (leading space stripped after BOS, <0xXX> decoded into
 * @p byte_buf). An id outside the vocabulary gives "".
 */
const char *kv_tokenizer_decode(const kv_tokenizer *t, int prev, int token, char byte_buf[2]);

#ifdef __cplusplus
}
#endif
#endif
