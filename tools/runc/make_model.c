/*
 * make_model: a random-weight llama2.c checkpoint of a given shape and a byte-level
 * tokenizer.bin of its vocabulary, written with kvlab's own library (kv_model_randomize,
 * kv_checkpoint_write, kv_tokenizer_bytes), so that `kvlab generate` and llama2.c's run.c can
 * be timed on the same files (compare.sh).
 *
 * usage: make_model OUT.bin TOKENIZER.bin dim hidden layers heads kv_heads vocab seq_len [seed]
 */
#include <stdio.h>
#include <stdlib.h>

#include "kv_checkpoint.h"
#include "kv_config.h"
#include "kv_model.h"
#include "kv_tokenizer.h"

int main(int argc, char **argv)
{
    if (argc < 10 || argc > 11) {
        fprintf(stderr, "usage: %s OUT.bin TOKENIZER.bin dim hidden layers heads kv_heads vocab "
                        "seq_len [seed]\n", argv[0]);
        return 2;
    }
    kv_config c = {0};
    c.dim = atoi(argv[3]);
    c.hidden_dim = atoi(argv[4]);
    c.n_layers = atoi(argv[5]);
    c.n_heads = atoi(argv[6]);
    c.n_kv_heads = atoi(argv[7]);
    c.vocab_size = atoi(argv[8]);
    c.seq_len = atoi(argv[9]);
    kv_config_set_defaults(&c);
    c.tied_classifier = 1; /* as llama2.c's stories15M.bin: the classifier is the embedding */
    kv_err err = {{0}};
    kv_model m = {0};
    kv_tokenizer tok = {0};
    int st = kv_config_validate(&c, &err);
    if (!st) st = kv_model_alloc(&m, &c, &err);
    if (!st) {
        kv_model_randomize(&m, argc > 10 ? strtoull(argv[10], NULL, 10) : 1234);
        st = kv_checkpoint_write(argv[1], &m, KV_FILE_LLAMA2C, &err);
    }
    if (!st) st = kv_tokenizer_bytes(&tok, c.vocab_size, &err);
    if (!st) st = kv_tokenizer_write(argv[2], &tok, &err);
    kv_tokenizer_free(&tok);
    kv_model_free(&m);
    if (st) {
        fprintf(stderr, "%s: %s\n", argv[0], err.msg);
        return 1;
    }
    return 0;
}
