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

int kv_tokenizer_read(const char *path, int vocab_size, kv_tokenizer *t, kv_err *err);
int kv_tokenizer_write(const char *path, const kv_tokenizer *t, kv_err *err);
void kv_tokenizer_free(kv_tokenizer *t);

/**
 * The embedded byte-level tokenizer: <unk>, <s>, </s>, then <0x00>..<0xFF> (ids 3..258),
 * then ids up to vocab_size filled with deterministic merged pairs of printable bytes.
 */
int kv_tokenizer_bytes(kv_tokenizer *t, int vocab_size, kv_err *err);

/** Encode text; bos/eos add ids 1/2. tokens must hold strlen(text)+3; count in *n. */
int kv_tokenizer_encode(const kv_tokenizer *t, const char *text, int bos, int eos, int *tokens,
                        int *n, kv_err *err);
/** Text of @p token following @p prev (leading space stripped after BOS, <0xXX> decoded). */
const char *kv_tokenizer_decode(const kv_tokenizer *t, int prev, int token, char byte_buf[2]);

#ifdef __cplusplus
}
#endif
#endif
