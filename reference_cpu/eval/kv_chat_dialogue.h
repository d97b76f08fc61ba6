/**
 * @file kv_chat_dialogue.h
 * Multi-turn memory of a chat model: scripted conversations in which facts (a name, a number,
 * a place) are stated early, unrelated turns follow, and each fact is asked for some turns
 * later. The conversation runs through kv_chat (kv_chat.h): one cache slot keeps every earlier
 * turn, so a fact asked for is read from the cache the earlier turns left, in whatever format
 * it stores them.
 *
 * The script (datasets/chat-dialogues/README.md), one item a line; '#' lines and empty lines
 * are skipped:
 *
 *   user: TEXT                   a turn: the user says TEXT, the model replies
 *   user: """                    a turn of several lines, up to a line holding only """
 *   fact NAME: VALUE             the turn just above states fact NAME; VALUE is its answer
 *   ask NAME | QUESTION | OPENING
 *                                a turn asking for NAME: the user says QUESTION, the reply is
 *                                started with OPENING ("My locker code is") and continued
 *                                greedily
 *
 * The rule: an ask passes when VALUE appears in the reply (ASCII case ignored), the opening
 * excluded. Its distance is the number of turns from the fact's turn to the ask (2: one turn
 * between them) and the tokens between the two turns' starts. A reply that restates the fact
 * puts it back in the recent context, so a script asks for each fact once.
 */
#ifndef KV_CHAT_DIALOGUE_H
#define KV_CHAT_DIALOGUE_H

#include "kv_chat.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_CD_NAME 32  /* a fact's name, NUL included */
#define KV_CD_VALUE 64 /* a fact's value, NUL included */
#define KV_CD_REPLY 64 /* reply tokens kept per turn */

typedef struct {
    char name[KV_CD_NAME];
    char value[KV_CD_VALUE];
    int turn; /**< the turn that states it */
} kv_cd_fact;

typedef struct {
    const char *text;    /**< the user's message (into the script's buffer) */
    size_t len;
    int ask;             /**< the fact asked for, or -1 */
    const char *opening; /**< the reply's first words (NUL-terminated), or NULL */
    int line;            /**< in the file, for messages */
} kv_cd_turn;

typedef struct {
    char name[128];
    char *buf;          /* the text, cut in place */
    kv_cd_turn *turns;  /* [n_turns] */
    int n_turns;
    kv_cd_fact *facts;  /* [n_facts] */
    int n_facts;
} kv_chat_script;

/** Parse a script (@p text NUL-terminated; copied); errors name @p name and the line: a fact
 * without a turn above it, a name stated twice, an ask of an unknown fact or of one stated
 * later, a value or name too long, an unclosed """. kv_chat_script_free(). */
int kv_chat_script_parse(const char *text, const char *name, kv_chat_script *s, kv_err *err);
/** kv_chat_script_parse() on a file (at most 1 MiB; name = the path). */
int kv_chat_script_read(const char *path, kv_chat_script *s, kv_err *err);
void kv_chat_script_free(kv_chat_script *s);

/** One turn's outcome. */
typedef struct {
    int start;                /**< tokens in the conversation when the turn began */
    int reply[KV_CD_REPLY];   /**< the chosen reply tokens [n_reply] */
    int n_reply;
    int prefix_hit;           /**< tokens adopted from a prefix cache (kv_chat_stats) */
    int fed;                  /**< tokens prefilled this turn */
    /* asks only */
    int ask;                  /**< the fact asked for, or -1 */
    int distance;             /**< turns since the fact's turn */
    int distance_tokens;      /**< tokens since the fact's turn began */
    int pass;                 /**< the value appears in the reply */
    char text[160];           /**< the reply's text (cut), the opening excluded */
} kv_cd_result;

/**
 * Run @p s on @p c (reset first): each turn through kv_chat_turn_opened(), replies of at most
 * @p max_reply tokens (@p max_answer for an ask; both <= KV_CD_REPLY), greedy. res [n_turns].
 * @p on_turn (may be NULL) is called after each turn with the turn's index. Errors of the
 * session (a full context: KV_ERR_CAPACITY) name the script and the turn.
 */
int kv_chat_script_run(kv_chat *c, const kv_chat_script *s, int max_reply, int max_answer,
                       void (*on_turn)(void *user, int turn), void *user, kv_cd_result *res,
                       kv_err *err);

/** 1 when @p value appears in @p text, ASCII case ignored (the ask's rule). */
int kv_cd_match(const char *text, const char *value);

#ifdef __cplusplus
}
#endif
#endif
