/**
 * @file kv_chat.h
 * A conversation with a model: its chat template rendered into token ids, and the turns run
 * on one cache slot that keeps the K/V of every earlier turn.
 *
 * The template. A GGUF file carries its chat template as Jinja text
 * (tokenizer.chat_template). kvlab runs no Jinja: it recognises the two families that
 * template text spells out, and renders their fixed shapes itself:
 *
 *   ChatML   (contains "<|im_start|>"; SmolLM2, Qwen2, ...):
 *            <|im_start|> role "\n" content <|im_end|> "\n"   per message,
 *            <|im_start|> "assistant\n"                          to start the reply;
 *            a template that writes a system message when the first one is not (SmolLM2's
 *            "You are a helpful AI assistant named SmolLM, trained by Hugging Face") has that
 *            default read out of its text.
 *   Llama 3  (contains "<|start_header_id|>"):
 *            <|begin_of_text|> once, then per message
 *            <|start_header_id|> role <|end_header_id|> "\n\n" content <|eot_id|>,
 *            <|start_header_id|> "assistant" <|end_header_id|> "\n\n" to start the reply.
 *
 * Control tokens are put in as ids (kv_vocab_find()); the text between them is encoded with
 * special = 0, so "<|im_end|>" typed by a user stays five plain-text tokens and cannot end
 * the turn. Each stretch of text between two control tokens is encoded as one piece, as
 * llama.cpp does when it tokenizes a rendered prompt with special tokens parsed. The
 * end-of-turn token (<|im_end|>, <|eot_id|>) ends a reply.
 *
 * The session. Turn k feeds only what is new: the end of the reply before it (the token that
 * ended it, and the template's closing text), the user's message and the reply's header. The
 * cache already holds every earlier token (tokens reused, not recomputed). With recompute = 1
 * each turn resets the slot and prefills the whole conversation instead (chapter 01's way):
 * the same ids at the same positions, so the same tokens with a lossless cache, for many times
 * the work. The reply's ids are kept as sampled, never re-encoded from their text (its text
 * encoded again may split differently).
 */
#ifndef KV_CHAT_H
#define KV_CHAT_H

#include <stddef.h>

#include "kv_backend.h"
#include "kv_sampler.h"
#include "kv_vocab.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The template families kvlab renders. */
typedef enum {
    KV_CHAT_CHATML = 1, /**< <|im_start|> role \n content <|im_end|> \n */
    KV_CHAT_LLAMA3 = 2  /**< <|start_header_id|> role <|end_header_id|> \n\n content <|eot_id|> */
} kv_chat_format;

#define KV_CHAT_SYSTEM_MAX 1024

/** A recognised template, with its control tokens' ids in one vocabulary. */
typedef struct {
    int format;        /**< ::kv_chat_format */
    int msg_start;     /**< <|im_start|> or <|start_header_id|> */
    int msg_end;       /**< <|im_end|> or <|eot_id|>: the end of a turn, which stops a reply */
    int header_end;    /**< Llama 3: <|end_header_id|>; ChatML: -1 */
    int begin;         /**< Llama 3: <|begin_of_text|>, once at the start; ChatML: -1 */
    char default_system[KV_CHAT_SYSTEM_MAX]; /**< written when the first message is not a
                                               *   system message; "" for none */
} kv_chat_template;

/**
 * Recognise the template text @p tpl (@p len bytes; not NUL-terminated) and find its control
 * tokens in @p v. Anything but ChatML and Llama 3 -> KV_ERR_UNSUPPORTED: "chat template not
 * recognised (kvlab knows ChatML and Llama 3); the template begins: ..."; a control token the
 * vocabulary lacks -> KV_ERR_FORMAT naming it. @p v NULL: recognition alone (the ids -1).
 */
int kv_chat_template_parse(const char *tpl, size_t len, const kv_vocab *v, kv_chat_template *t,
                           kv_err *err);
/** "ChatML" or "Llama 3". */
const char *kv_chat_format_name(int format);

/**
 * Append the ids of one message to ids [cap] from *n on (*n grows): role and content as the
 * template writes them, closing text included. @p first: the conversation's first message
 * (Llama 3 writes <|begin_of_text|> before it). KV_ERR_CAPACITY when cap is too small.
 */
int kv_chat_render_message(const kv_chat_template *t, const kv_vocab *v, int first,
                           const char *role, const char *content, size_t content_len, int *ids,
                           int cap, int *n, kv_err *err);
/** Append the ids that start the assistant's reply (the generation prompt). */
int kv_chat_render_reply_start(const kv_chat_template *t, const kv_vocab *v, int *ids, int cap,
                               int *n, kv_err *err);
/** Append what closes an assistant message after its last content token: ChatML <|im_end|>
 * "\n", Llama 3 <|eot_id|>; @p ended 1 when the reply's last id already is the end-of-turn
 * token (then only what follows it: ChatML "\n", Llama 3 nothing). */
int kv_chat_render_reply_end(const kv_chat_template *t, const kv_vocab *v, int ended, int *ids,
                             int cap, int *n, kv_err *err);

/**
 * A one-turn conversation's prompt, from *n on: @p system (NULL or "": the template's default,
 * none when it has none), the user's message @p text [len] and the reply's header: the ids a
 * kv_chat session feeds for its first turn. A prompt for commands that run one request at a
 * time (kvlab spec --script, kvlab serve's text traces).
 */
int kv_chat_render_prompt(const kv_chat_template *t, const kv_vocab *v, const char *system,
                          const char *text, size_t len, int *ids, int cap, int *n, kv_err *err);

/* ---- the session ---------------------------------------------------------------------- */

/** How a reply ended. */
typedef enum {
    KV_CHAT_END_TURN = 0, /**< the model chose the end-of-turn token */
    KV_CHAT_MAX_TOKENS,   /**< max_tokens reached */
    KV_CHAT_CONTEXT_FULL  /**< the cache has no room for another token */
} kv_chat_end;

/** What one turn did. */
typedef struct {
    int reused;      /**< tokens the cache held before the turn, not run again */
    int fed;         /**< tokens prefilled this turn (its template tokens and message) */
    int n_reply;     /**< reply tokens, the end-of-turn token included when chosen */
    int end;         /**< ::kv_chat_end */
    int cached;      /**< tokens in the cache after the turn */
    double prefill_s, decode_s; /**< wall time of the prefill and of the reply's steps */
    int decode_steps;           /**< one-token forward steps of the reply */
    int prefix_hit;  /**< tokens an empty slot adopted from the prefix cache (paged layout
                      *   with prefix caching on; else 0), counted in reused */
} kv_chat_stats;

/** Called with each reply token as it is chosen (may be NULL). */
typedef void (*kv_chat_token_fn)(void *user, int token);

typedef struct {
    kv_backend *b;  /**< borrowed: slot 0 of its cache holds the conversation */
    const kv_chat_template *t;
    const kv_vocab *v;
    int *ids;       /**< [cap] the conversation's ids; ids[0..n_cached) are in the cache */
    int n_ids, n_cached, cap;
    int last_end;   /**< the last reply ended with the end-of-turn token (1), or was cut (0);
                     *   -1 before the first reply */
    int recompute;  /**< 1: every turn resets the cache and prefills the whole conversation */
    float *logits;  /**< [vocab] */
    char system[KV_CHAT_SYSTEM_MAX]; /**< the system message ("" none: the template's default) */
} kv_chat;

/**
 * Start a conversation on @p b (its slot 0, capacity = the longest conversation) with
 * template @p t over vocabulary @p v. @p system: a system message, or NULL / "" for the
 * template's default (if it has one).
 */
int kv_chat_init(kv_chat *c, kv_backend *b, const kv_chat_template *t, const kv_vocab *v,
                 const char *system, kv_err *err);
/** Forget the conversation and empty the cache (the system message stays). */
void kv_chat_reset(kv_chat *c);
void kv_chat_free(kv_chat *c);

/**
 * One turn: feed the user's message @p text (@p len bytes) and the reply's header, then choose
 * up to @p max_tokens reply tokens with @p sampler (NULL: greedy), each passed to @p on_token
 * as it is chosen. reply [max_tokens] (may be NULL) receives the ids. When the new tokens do
 * not fit the cache: KV_ERR_CAPACITY saying so, with the conversation unchanged (/reset).
 */
int kv_chat_turn(kv_chat *c, const char *text, size_t len, int max_tokens, kv_sampler *sampler,
                 kv_chat_token_fn on_token, void *user, int *reply, kv_chat_stats *st,
                 kv_err *err);

/**
 * kv_chat_turn() with the reply's first words given: @p opening (NUL-terminated plain text,
 * NULL or "" for none) is put after the reply's header and fed with the turn, so the model
 * continues it ("My locker code is" -> " 4721."); reply receives only the chosen tokens, the
 * conversation holds both. A test of memory asks this way: the answer's form is fixed, only
 * its content is the model's.
 */
int kv_chat_turn_opened(kv_chat *c, const char *text, size_t len, const char *opening,
                        int max_tokens, kv_sampler *sampler, kv_chat_token_fn on_token,
                        void *user, int *reply, kv_chat_stats *st, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
