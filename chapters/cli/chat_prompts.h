/*
 * Prompts of real text for the commands that run one request at a time on a chat model
 * (kvlab spec --script, kvlab serve --prompts): each a one-turn conversation in the model's
 * chat template (kv_chat_render_prompt(): the default system message, the user's message, the
 * reply's header), so they all open alike, as a deployment's requests do.
 *
 * Where the messages come from, by file: a chat script (*.chat,
 * datasets/chat-dialogues/README.md) gives each of its user turns, asks included (the
 * question, not the opening); any other file is plain text, cut into slices of @p lines lines,
 * each asked for a summary ("Summarise this text:" and the slice).
 */
#ifndef KV_CLI_CHAT_PROMPTS_H
#define KV_CLI_CHAT_PROMPTS_H

#include "model_load.h"

typedef struct {
    int **ids; /* [n][len[i]] */
    int *len;  /* [n] */
    int n, longest;
} kv_cli_prompts;

/** The prompts of every file of @p list (paths separated by ','), in order, at most @p max
 * (0: all), each at most @p cap tokens (KV_ERR_CAPACITY naming the file). KV_ERR_ARG when the
 * model has no chat template; the files' errors name them. kv_cli_prompts_free() after. */
int kv_cli_prompts_files(const char *list, int lines, int max, int cap, const kv_cli_model *mdl,
                         kv_cli_prompts *p, kv_err *err);
/** One prompt of @p n ids (allocated, uninitialised) appended to @p p (longest: the caller's). */
int *kv_cli_prompts_add(kv_cli_prompts *p, int n, kv_err *err);
void kv_cli_prompts_free(kv_cli_prompts *p);

#endif
