/*
 * The GGUF tokenizers (kv_vocab.h). Not yet implemented: every entry point refuses.
 */
#include "kv_vocab.h"

int kv_vocab_from_gguf(const kv_gguf *g, kv_vocab **out, kv_err *err)
{
    (void)g;
    if (out) *out = NULL;
    return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_vocab_from_gguf: GGUF tokenizers not built yet");
}

void kv_vocab_free(kv_vocab *v) { (void)v; }
int kv_vocab_size(const kv_vocab *v) { (void)v; return 0; }

int kv_vocab_encode(const kv_vocab *v, const char *text, size_t len, int add_bos, int special,
                    int *ids, int cap, int *n, kv_err *err)
{
    (void)v; (void)text; (void)len; (void)add_bos; (void)special; (void)ids; (void)cap;
    if (n) *n = 0;
    return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_vocab_encode: GGUF tokenizers not built yet");
}

int kv_vocab_piece(const kv_vocab *v, int id, char *buf, int cap)
{
    (void)v; (void)id; (void)buf; (void)cap;
    return -1;
}

int kv_vocab_find(const kv_vocab *v, const char *token_text) { (void)v; (void)token_text; return -1; }
int kv_vocab_bos(const kv_vocab *v) { (void)v; return -1; }
int kv_vocab_eos(const kv_vocab *v) { (void)v; return -1; }
int kv_vocab_is_control(const kv_vocab *v, int id) { (void)v; (void)id; return 0; }
