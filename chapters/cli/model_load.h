/**
 * @file model_load.h
 * The one model loader of the kvlab commands: every `--model` (and `--default`, `--tokenizer`)
 * goes through kv_cli_model_open(), which returns the fp32 model and its text codec.
 *
 * What --model names:
 *  - an embedded default ("tiny", "tiny-gqa", "small"; --default NAME too): random weights
 *    from a fixed seed, with the embedded byte tokenizer when the command reads text;
 *  - `trained`: the model kvlab ships (datasets/models/, checked by SHA-256) with its
 *    tokenizer and held-out text;
 *  - a llama2.c or kvlab checkpoint FILE, with --tokenizer FILE (llama2.c's tokenizer.bin)
 *    when the command reads or writes text;
 *  - a GGUF file (recognised by its magic, kv_model_path_is_gguf()), or `smollm2`: the
 *    SmolLM2-135M-Instruct GGUF that tools/fetch-model.sh fetches into $KVLAB_MODELS (default
 *    ~/.cache/kvlab/models; kv_cli_model_resolve()). Its weights are dequantized to fp32 once
 *    (kv_cli_gguf_load()), or kept as --weights asks (native, q8_0, f16: kv_linear.h), its
 *    tokenizer and chat template come from the file
 *    (docs/real-model.md).
 *
 * The text codec hides which tokenizer a model came with behind four calls: encode, the
 * piece of one token, BOS and EOS (kv_cli_encode(), kv_cli_piece(), kv_cli_bos(),
 * kv_cli_eos()).
 */
#ifndef KV_CLI_MODEL_LOAD_H
#define KV_CLI_MODEL_LOAD_H

#include "cli.h"
#include "kv_tokenizer.h"

/** Where a model came from (kv_cli_model.source). */
typedef enum {
    KV_CLI_SRC_DEFAULT = 0, /**< an embedded default: random weights from a fixed seed */
    KV_CLI_SRC_FILE,        /**< a llama2.c or kvlab checkpoint */
    KV_CLI_SRC_TRAINED,     /**< `trained`: the shipped model (a kvlab checkpoint) */
    KV_CLI_SRC_GGUF         /**< a GGUF file (or `smollm2`): weights dequantized, its tokenizer */
} kv_cli_source;

/** Whether a command needs a tokenizer (kv_cli_model_args.text). */
typedef enum {
    KV_CLI_TEXT_NONE = 0, /**< token ids only: no tokenizer is read */
    KV_CLI_TEXT_NEED,     /**< text in or out: a model without a tokenizer is refused */
    KV_CLI_TEXT_ANY       /**< text when the model has a tokenizer (the embedded defaults' byte
                           *   tokenizer, --tokenizer, trained's), ids otherwise */
} kv_cli_text_need;

/** What a command was given. */
typedef struct {
    const char *model;     /**< --model: an embedded default's name, trained, or a FILE; NULL */
    const char *def;       /**< --default NAME (an embedded default), or NULL */
    const char *fallback;  /**< the embedded default when neither is given (NULL: one is required) */
    const char *tokenizer; /**< --tokenizer FILE for a checkpoint, or NULL */
    int text;              /**< ::kv_cli_text_need: does the command read or write text */
    int heldout;           /**< trained: the command reads its held-out text (checked too) */
    int storage;           /**< a GGUF model's matrices (kv_weights_storage, --weights on the
                            *   cpu: kv_cli_engine_storage()); 0: fp32. Another model: f32 only */
} kv_cli_model_args;

/** A loaded model and its text codec. */
typedef struct {
    kv_model m;      /**< fp32 weights */
    int source;      /**< ::kv_cli_source */
    char name[KV_CLI_PATH_MAX + 64];    /**< what messages call it: "tiny", "trained", the path */
    char heldout[KV_CLI_PATH_MAX + 64]; /**< trained: its held-out text; else "" */
    kv_tokenizer tok; /**< llama2.c's tokenizer, when have_tok */
    int have_tok;
    struct kv_vocab *vocab; /**< a GGUF model's tokenizer (kv_vocab.h); else NULL */
    char *chat_template;    /**< a GGUF model's tokenizer.chat_template, NUL-terminated; or NULL */
} kv_cli_model;


/**
 * Load what @p a names into @p out (zeroed first). On failure *what names the argument at
 * fault ("--model", "--tokenizer" or the file), @p err says why, and @p out holds nothing.
 * --model and --default together are KV_ERR_ARG, and so is --tokenizer with a GGUF file.
 */
int kv_cli_model_open(const kv_cli_model_args *a, kv_cli_model *out, const char **what,
                      kv_err *err);
/** Free the model and its codec (safe on a zeroed struct). */
void kv_cli_model_close(kv_cli_model *mdl);

/** kv_cli_model_open() for a command: on failure prints "cmd: what: why" and returns the exit
 * code (kv_cli_fail()); KV_EXIT_OK when loaded. */
int kv_cli_model_load(const char *cmd, const kv_cli_model_args *a, kv_cli_model *out);

/** The model the variants of a command run (eval ppl, passkey: --kv-heads N): @p m itself
 * (*out = m) when @p kv_heads is 0 or its own H_kv, else its KV heads mean-pooled (fewer;
 * 1 = MQA) or copied out (more, exact) into @p conv (kv_convert.h; the caller frees it with
 * kv_model_free(), a zeroed model otherwise). KV_EXIT_OK, or the exit code after a message
 * naming @p cmd and --kv-heads. */
int kv_cli_model_kv_heads(const char *cmd, const kv_model *m, int kv_heads, kv_model *conv,
                          const kv_model **out);

/** 1 when what --model names brings its tokenizer (an embedded default, trained, smollm2, a
 * GGUF file; NULL: the fallback default), 0 for a checkpoint file (it needs --tokenizer). */
int kv_cli_model_has_text(const char *model);

/** 1 when the model has a tokenizer (text in and out); 0: token ids only. */
int kv_cli_has_text(const kv_cli_model *mdl);
/** BOS and EOS ids of the model's tokenizer (llama2.c: 1 and 2). */
int kv_cli_bos(const kv_cli_model *mdl);
int kv_cli_eos(const kv_cli_model *mdl);
/**
 * Encode @p text into *ids (allocated here, [*n], the caller frees), with BOS first when
 * @p bos (and the tokenizer asks for one). KV_ERR_ARG when the model has no tokenizer.
 */
int kv_cli_encode(const kv_cli_model *mdl, const char *text, int bos, int **ids, int *n,
                  kv_err *err);
/**
 * The text of token @p id following @p prev, NUL-terminated in @p buf [cap] (cut to fit);
 * returns its length in bytes (0 for an id outside the vocabulary).
 */
int kv_cli_piece(const kv_cli_model *mdl, int prev, int id, char *buf, int cap);

/** The ids that end a text, into ids [cap]; returns how many: llama2.c's BOS and EOS, or a
 * GGUF vocabulary's EOS and the end-of-text and end-of-turn tokens it has (<|endoftext|>,
 * <|im_end|>, <|eot_id|>, <|end_of_text|>). */
int kv_cli_stop_ids(const kv_cli_model *mdl, int *ids, int cap);
/** The stored text of token @p id, control tokens included ("<|im_end|>"), for messages. */
void kv_cli_piece_name(const kv_cli_model *mdl, int id, char *buf, int cap);

#endif
