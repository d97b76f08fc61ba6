/*
 * A GGUF chat model opened for a realmodel test: the file, its tokenizer, its chat template
 * recognised and its fp32 model, closed together (kv_test_chat_close() whatever the status).
 */
#ifndef KV_TEST_CHAT_MODEL_H
#define KV_TEST_CHAT_MODEL_H

#include <string.h>

#include "kv_chat.h"
#include "kv_gguf.h"
#include "kv_gguf_model.h"
#include "kv_vocab.h"

typedef struct {
    kv_gguf *g;
    kv_vocab *v;
    kv_chat_template t;
    kv_model m;
} kv_test_chat;

static inline int kv_test_chat_open(const char *path, kv_test_chat *c, kv_err *e)
{
    kv_gguf_str tpl = {0};
    memset(c, 0, sizeof *c);
    int st = kv_gguf_open(path, &c->g, e);
    if (!st) st = kv_vocab_from_gguf(c->g, &c->v, e);
    if (!st) st = kv_gguf_get_str(c->g, "tokenizer.chat_template", &tpl, e);
    if (!st) st = kv_chat_template_parse(tpl.s, tpl.n, c->v, &c->t, e);
    if (!st) st = kv_gguf_model_load(c->g, &c->m, e);
    return st;
}

static inline void kv_test_chat_close(kv_test_chat *c)
{
    kv_model_free(&c->m);
    kv_vocab_free(c->v);
    kv_gguf_close(c->g);
    memset(c, 0, sizeof *c);
}

#endif
