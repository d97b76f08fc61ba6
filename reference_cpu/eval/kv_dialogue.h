/**
 * @file kv_dialogue.h
 * Multi-turn consistency over the recall models: dialogues in a small text format, an
 * incremental session (each turn is prefilled onto the cache the earlier turns left, then the
 * reply is decoded), and a from-scratch recompute to check that the cache changed nothing.
 *
 * Dialogue files (datasets/dialogues/README.md): one turn per line, items separated by spaces:
 *   k3=v7    a fact: key 3 has value 7 (each key is stated once per dialogue)
 *   ~20      20 filler tokens, drawn from the dialogue's seed
 *   f12      filler token 12
 *   k3?      a question about key 3 (last item of its turn); the expected reply is v7
 * plus "seed N" and '#' comments. A turn is rendered as "|" (or "<s>" for the first) followed
 * by its items in the model's tokens (kv_recall_fact_tokens); the reply is one greedy token:
 * the value for a question turn, "ok" for any other.
 */
#ifndef KV_DIALOGUE_H
#define KV_DIALOGUE_H

#include "kv_backend.h"
#include "kv_recall.h"

#ifdef __cplusplus
extern "C" {
#endif

/** What one item of a dialogue turn is. */
typedef enum {
    KV_DLG_FACT = 0,  /**< a fact stated: key and value tokens */
    KV_DLG_QUESTION,  /**< a question about a key, with the expected answer */
    KV_DLG_FILLER,    /**< one filler token, by its filler index */
    KV_DLG_FILLER_RUN /**< a run of count filler tokens */
} kv_dlg_item_type;

typedef struct {
    int type;       /**< ::kv_dlg_item_type */
    int key, value; /**< FACT: both; QUESTION: key (value = the expected answer) */
    int count;      /**< FILLER: filler index; FILLER_RUN: how many */
} kv_dlg_item;

typedef struct {
    int first_item, n_items; /**< into kv_dialogue.items */
    int question_key;        /**< -1 when the turn asks nothing */
    int expect_value;        /**< value index the reply must be, or -1 ("ok") */
    int line;                /**< line in the file, for messages */
} kv_dlg_turn;

typedef struct {
    char name[128];
    uint64_t seed;
    int n_turns;
    kv_dlg_turn *turns; /* [n_turns] */
    int n_items;
    kv_dlg_item *items; /* [n_items] */
} kv_dialogue;

/** Parse dialogue text; @p name labels messages. Errors name the line. kv_dialogue_free(). */
int kv_dialogue_parse(const char *text, const char *name, kv_dialogue *d, kv_err *err);
/** kv_dialogue_parse() on a file (name = the path). */
int kv_dialogue_read(const char *path, kv_dialogue *d, kv_err *err);
/** Free a parsed dialogue (safe on a zeroed struct). */
void kv_dialogue_free(kv_dialogue *d);

/**
 * Tokens of turn @p t for a model kind: "<s>" (turn 0) or "|", then the items.
 * tokens [max]; count in *n. KV_ERR_CAPACITY when it does not fit @p max.
 */
int kv_dialogue_render(const kv_dialogue *d, int t, int kind, int *tokens, int max, int *n,
                       kv_err *err);
/** Token the reply to turn @p t must be: the value token, or "ok". */
int kv_dialogue_expected(const kv_dialogue *d, int t);

/** An incremental session: the cache of slot @p slot holds exactly @p history. */
typedef struct {
    kv_backend *b;
    int slot;
    int *history;  /* [cap] every token in the cache, in order */
    int n_history, cap;
    float *logits; /* [vocab] logits that chose the latest reply token */
} kv_session;

/** Start a session on an empty slot (it is reset); capacity = the backend's. */
int kv_session_open(kv_session *s, kv_backend *b, int slot, kv_err *err);
/**
 * One turn: prefill @p n tokens at the end of the cache, then decode @p n_reply tokens
 * greedily (each is forwarded, so the cache again holds the whole history). reply [n_reply].
 */
int kv_session_turn(kv_session *s, const int *tokens, int n, int n_reply, int *reply,
                    kv_err *err);
/** Release the session's cache slot and buffers. */
void kv_session_close(kv_session *s);

/**
 * From scratch: reset @p slot, prefill history[0..n) and return the greedy next token and
 * its logits [vocab]. What the session's reply must equal with an exact cache.
 */
int kv_session_recompute(kv_backend *b, int slot, const int *history, int n, float *logits,
                         int *token, kv_err *err);

/** What one turn did. */
typedef struct {
    int n_tokens;       /**< tokens the turn added (before the reply) */
    int cached;         /**< tokens in the cache after the reply */
    int expected;       /**< token the reply must be */
    int reply;          /**< greedy reply */
    int pass;           /**< reply == expected */
    float margin;       /**< logit(expected) - best other logit */
    int recomputed;     /**< 1 when the from-scratch check ran */
    int recompute_token;/**< its greedy token */
    float recompute_diff; /**< max |logit difference| incremental vs from scratch */
} kv_dlg_result;

/**
 * Run a dialogue on @p b with a session in slot 0; with @p recompute, after every turn the
 * whole history is also run from scratch in slot 1 (the backend needs 2 slots) and compared.
 * res [d->n_turns].
 */
int kv_dialogue_run(kv_backend *b, const kv_dialogue *d, int kind, int recompute,
                    kv_dlg_result *res, kv_err *err);

/**
 * Called by kv_dialogue_run_hooked() after each turn @p t (its result and any from-scratch
 * check done), before the next turn is prefilled. s->logits chose the turn's reply and the
 * session's slot holds the whole history. The hook may move that slot's cache (chapter 07
 * swaps it out to a host tier and back) if the slot holds the same history when it returns.
 * A non-zero return stops the run with that status.
 */
typedef int (*kv_dlg_turn_fn)(void *user, kv_session *s, int t, kv_err *err);

/** kv_dialogue_run() with @p on_turn (may be NULL) called after every turn. */
int kv_dialogue_run_hooked(kv_backend *b, const kv_dialogue *d, int kind, int recompute,
                           kv_dlg_turn_fn on_turn, void *user, kv_dlg_result *res,
                           kv_err *err);

/** Tokens a dialogue needs in the cache for @p kind (all turns and replies). */
int kv_dialogue_length(const kv_dialogue *d, int kind);

#ifdef __cplusplus
}
#endif
#endif
