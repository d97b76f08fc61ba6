/*
 * What every kvlab eval subcommand reads (eval.c, eval_ppl.c): the model, its tokenizer and
 * the text encoded with BOS.
 */
#ifndef KV_CLI_EVAL_INPUTS_H
#define KV_CLI_EVAL_INPUTS_H

#include "model_load.h"

typedef struct {
    kv_cli_model mdl; /* the model and its tokenizer */
    char *text;
    int *ids; /* [n] */
    int n;
    const char *text_path; /* the text file's name, without its folder */
} eval_inputs;

/** KV_EXIT_OK, or the exit code after a message on stderr; @p want: the tokens the command
 * reads (0: the whole text, -1: the model's seq_len); @p storage: a GGUF model's matrices
 * (kv_weights_storage, --weights on the cpu) */
int eval_inputs_load(const char *cmd, const char *model_path, const char *tok_path,
                     const char *text_path, long want, int storage, eval_inputs *in);
void eval_inputs_free(eval_inputs *in);

int cmd_eval_ppl(int argc, char **argv);

#endif
