/**
 * @file kv_vocab.h
 * The tokenizers a GGUF file carries (tokenizer.ggml.*), giving the ids llama.cpp gives.
 *
 * Two kinds, named by tokenizer.ggml.model:
 *  - `gpt2`: byte-level BPE. Text is split by a pre-tokenizer (tokenizer.ggml.pre: `gpt2`,
 *    `llama-bpe`, `smollm`, ...), each piece's bytes are mapped to GPT-2's printable
 *    characters, then merged pair by pair in the order of tokenizer.ggml.merges (rank = index).
 *  - `llama`: SentencePiece-style BPE. Spaces become U+2581 "▁" (one is put in front when
 *    tokenizer.ggml.add_space_prefix asks), then the adjacent pair whose join is the token of
 *    highest score merges first; a character with no token falls back to <0xXX> byte tokens.
 *
 * Control tokens (token_type 3) and user-defined tokens (4) are matched in the text as single
 * tokens only when the caller asks (special = 1); otherwise they are text like any other.
 */
#ifndef KV_VOCAB_H
#define KV_VOCAB_H

#include <stddef.h>

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_gguf kv_gguf; /* kv_gguf.h */
typedef struct kv_vocab kv_vocab;

/** Bytes, not NUL-terminated. */
typedef struct {
    const char *s;
    size_t n;
} kv_vocab_str;

/** A field the file does not give: the model's default applies (llama.cpp's defaults). */
#define KV_VOCAB_UNSET (-2)

/**
 * A tokenizer as the tokenizer.ggml.* keys describe it; kv_vocab_create() copies it all.
 * Defaults for UNSET fields: `llama` BOS 1, EOS 2, unknown 0, add BOS, no EOS, space prefix;
 * `gpt2` BOS = EOS = 11 (when in range), no unknown, no BOS (except the Llama 3 family of
 * pre-tokenizers, which adds it), no EOS.
 */
typedef struct {
    const char *model;          /**< tokenizer.ggml.model: "gpt2" or "llama" */
    const char *pre;            /**< tokenizer.ggml.pre, NULL when absent ("default") */
    int n_tokens;               /**< tokenizer.ggml.tokens */
    const kv_vocab_str *tokens; /**< [n_tokens] */
    const float *scores;        /**< [n_tokens] tokenizer.ggml.scores, NULL: all 0 */
    const int *types;           /**< [n_tokens] tokenizer.ggml.token_type, NULL: all normal (1) */
    int n_merges;               /**< tokenizer.ggml.merges (gpt2 only) */
    const kv_vocab_str *merges; /**< [n_merges] "left right"; rank = index */
    int bos, eos, unk;          /**< token ids, or KV_VOCAB_UNSET */
    int add_bos, add_eos;       /**< 0/1, or KV_VOCAB_UNSET */
    int add_space_prefix;       /**< 0/1, or KV_VOCAB_UNSET (llama only) */
} kv_vocab_desc;

/** The token types of tokenizer.ggml.token_type. */
enum {
    KV_TOKEN_UNDEFINED = 0,
    KV_TOKEN_NORMAL = 1,
    KV_TOKEN_UNKNOWN = 2,
    KV_TOKEN_CONTROL = 3,
    KV_TOKEN_USER_DEFINED = 4,
    KV_TOKEN_UNUSED = 5,
    KV_TOKEN_BYTE = 6
};

/**
 * Build a tokenizer from its description (what kv_vocab_from_gguf() reads; tests build small
 * ones by hand). An unknown model or pre-tokenizer -> KV_ERR_UNSUPPORTED; a duplicate token,
 * a score that is not finite, a gpt2 vocabulary without merges -> KV_ERR_FORMAT naming it.
 * A type outside 0..6 is undefined (decodes to nothing), as llama.cpp reads it.
 */
int kv_vocab_create(const kv_vocab_desc *d, kv_vocab **out, kv_err *err);

/**
 * Build the tokenizer of an open GGUF file. A missing or malformed tokenizer.ggml key, a
 * model or pre-tokenizer kvlab does not know, a merge naming no token -> KV_ERR_FORMAT or
 * KV_ERR_UNSUPPORTED naming it. The vocabulary copies what it needs: @p g may be closed after.
 */
int kv_vocab_from_gguf(const kv_gguf *g, kv_vocab **out, kv_err *err);
/** Free (NULL is fine). */
void kv_vocab_free(kv_vocab *v);
/** Number of tokens. */
int kv_vocab_size(const kv_vocab *v);

/**
 * text (len bytes, any bytes, at most 256 MiB) -> ids; special = 1 matches control tokens
 * (<|im_start|>...) in the text, 0 treats them as plain text (user-defined tokens are matched
 * either way, as llama.cpp does); add_bos: the vocabulary's own additions, llama.cpp's
 * add_special: BOS in front when it asks (tokenizer.ggml.add_bos_token), EOS at the end when
 * it asks (add_eos_token). Writes at most cap ids; *n = the count needed (KV_ERR_CAPACITY when
 * it exceeds cap: invalid UTF-8 can need up to 3 ids a byte).
 */
int kv_vocab_encode(const kv_vocab *v, const char *text, size_t len, int add_bos, int special,
                    int *ids, int cap, int *n, kv_err *err);
/**
 * The bytes of one token's text (byte-level BPE decoded; <0xXX> as the byte; ▁ as a space);
 * returns the full length, or -1 for an id outside the vocabulary; writes at most cap bytes.
 */
int kv_vocab_piece(const kv_vocab *v, int id, char *buf, int cap);
/** id of the token whose stored text is exactly @p token_text, or -1. */
int kv_vocab_find(const kv_vocab *v, const char *token_text);
/** BOS and EOS ids (-1 when the file names none). */
int kv_vocab_bos(const kv_vocab *v);
int kv_vocab_eos(const kv_vocab *v);
/** 1 for a control or user-defined token (token_type 3 or 4), 0 otherwise or out of range. */
int kv_vocab_is_control(const kv_vocab *v, int id);

#ifdef __cplusplus
}
#endif
#endif
