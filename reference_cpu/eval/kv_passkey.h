/**
 * @file kv_passkey.h
 * The pass-key test on a real model (the source article's "can it still find the keyword"):
 * a five-digit key hidden at a chosen depth of a long haystack, then asked for; the greedy
 * answer must start with the key's digits, exactly.
 *
 * The prompt, in token ids (each part encoded on its own, then joined; BOS first when the
 * vocabulary asks for one):
 *
 *   [BOS] intro  haystack[0 .. a)  needle  haystack[a .. h)  question
 *
 * (a chat model's template around it: kv_passkey_frame)
 *
 *   intro     "There is an important piece of information hidden inside a lot of irrelevant
 *              text. Find it and memorize it. I will quiz you about it."
 *   needle    " The pass key is 71432. Remember it. 71432 is the pass key."
 *   question  " What is the pass key? The pass key is"
 *
 * The haystack's h tokens fill the prompt to the length asked for; a = round(depth · h), so
 * depth 0 puts the key right after the intro and depth 1 right before the question. The
 * haystack is either the classic filler ("The grass is green. The sky is blue. The sun is
 * yellow. Here we go. There and back again.", repeated) or the tokens of a text, from its
 * start. Unlike the needle grid of kv_needle.h, whose constructed models make the answer a
 * property of the cache alone, this one asks a trained model: a miss can be the model's own
 * (a 135M model forgets too), so a cache variant is read against the lossless cache's row.
 *
 * The tokenizer reaches this layer as a kv_text_codec (the CLI's model loader provides one), so
 * the test runs on any model with text.
 */
#ifndef KV_PASSKEY_H
#define KV_PASSKEY_H

#include "kv_backend.h"
#include "kv_generate.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A model's tokenizer, as callbacks. */
typedef struct {
    void *ctx;
    /** text -> *ids (allocated, [*n], the caller frees), no BOS */
    int (*encode)(void *ctx, const char *text, int **ids, int *n, kv_err *err);
    /** the text of @p id after @p prev into buf [cap], NUL-terminated; its length */
    int (*piece)(void *ctx, int prev, int id, char *buf, int cap);
    int bos;          /**< BOS id to put first, or -1 */
    const int *stop;  /**< ids that end an answer [n_stop] */
    int n_stop;
} kv_text_codec;

/**
 * What surrounds the test's text: ids before the intro and after the question, and the
 * question's words. The plain frame (kv_passkey_run()'s default, @p frame NULL) is BOS, then
 * the question " What is the pass key? The pass key is", nothing after: a completion. A chat
 * model is asked through its template instead: pre = a system message and the user message's
 * opening, question " What is the pass key?", post = the user message's end, the assistant's
 * header and "The pass key is" (the CLI builds it, kvlab passkey --chat).
 */
typedef struct {
    const int *pre;       /* [n_pre] */
    int n_pre;
    const char *question; /* encoded after the haystack */
    const int *post;      /* [n_post] */
    int n_post;
} kv_passkey_frame;

/** The haystack: the classic filler, or a text's tokens. */
typedef struct {
    int *ids;  /* [n] the haystack's tokens, repeated as often as a prompt needs */
    int n;
} kv_passkey_hay;

/** One cell's outcome. */
typedef struct {
    int key;           /**< the five-digit key asked for */
    int n_prompt;      /**< tokens in the prompt */
    int needle_at;     /**< position of the needle's first token */
    int found;         /**< 1: the answer's first digits are the key */
    char answer[64];   /**< what the model said (its first tokens), for the table */
    double seconds;    /**< prefill and answer */
} kv_passkey_result;

/** The classic filler, encoded (free with kv_passkey_hay_free()). */
int kv_passkey_filler(const kv_text_codec *tc, kv_passkey_hay *hay, kv_err *err);
/** A text's tokens as the haystack (@p text NUL-terminated; at least 64 tokens). */
int kv_passkey_text(const kv_text_codec *tc, const char *text, kv_passkey_hay *hay, kv_err *err);
void kv_passkey_hay_free(kv_passkey_hay *hay);

/** The @p i-th key of a seeded series: five digits, 10000..99999. */
int kv_passkey_key(uint64_t seed, int i);

/**
 * Build the prompt of @p length tokens with @p key at @p depth (0..1) into *ids (allocated,
 * [*n]); *needle_at receives the needle's position. KV_ERR_ARG when @p length cannot hold the
 * intro, the needle and the question with at least one haystack token.
 */
int kv_passkey_prompt(const kv_text_codec *tc, const kv_passkey_frame *frame,
                      const kv_passkey_hay *hay, int length, double depth, int key, int **ids,
                      int *n, int *needle_at, kv_err *err);

/**
 * Run one cell on slot 0 of @p b (reset first): prefill the prompt, answer greedily with at
 * most 8 tokens, check the digits. The backend's capacity must hold length + 8.
 */
int kv_passkey_run(kv_backend *b, const kv_text_codec *tc, const kv_passkey_frame *frame,
                   const kv_passkey_hay *hay, int length, double depth, int key,
                   kv_passkey_result *res, kv_err *err);

/** A hook called before each forward step of a cell, with the step's first position and
 * its tokens: kv_generate()'s before_step (kv_probe_kivi_step(), KIVI emulated on an fp32
 * cache, is one). */
typedef kv_before_step_fn kv_passkey_step_fn;

/**
 * kv_passkey_run() with @p before_step (NULL: none, the same as kv_passkey_run()) called before
 * every forward step: the prompt is prefilled 32 tokens a step from position 0 (steps start at
 * multiples of 32, kv_gen_opts.prefill_step), then the answer goes one token a step; the same
 * greedy answer otherwise.
 */
int kv_passkey_run_hooked(kv_backend *b, const kv_text_codec *tc, const kv_passkey_frame *frame,
                          const kv_passkey_hay *hay, int length, double depth, int key,
                          kv_passkey_step_fn before_step, void *hook, kv_passkey_result *res,
                          kv_err *err);

/** 1 when @p answer, after spaces, starts with the digits of @p key and no further digit. */
int kv_passkey_match(const char *answer, int key);

#ifdef __cplusplus
}
#endif
#endif
