/*
 * The one model loader of the kvlab commands (model_load.h): an embedded default, `trained`,
 * a checkpoint file or a GGUF file (`smollm2`), each with its text codec. A command asks for a
 * model once, by what it was given, and never reads a checkpoint or a tokenizer itself.
 */
#include "model_load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_checkpoint.h"
#include "kv_convert.h"
#include "kv_gguf_model.h"
#include "kv_vocab.h"

/* A GGUF model: the weights dequantized to fp32, the tokenizer and the chat template (when
 * the command reads text) copied out of the file, which is closed again: nothing keeps its
 * mapping. */
static int open_gguf(const char *path, int text, int storage, kv_cli_model *out, kv_err *err)
{
    kv_gguf *g = NULL;
    int st = kv_cli_gguf_load(path, storage, &out->m, text == KV_CLI_TEXT_NONE ? NULL : &g, err);
    if (st || !g) return st;
    st = kv_vocab_from_gguf(g, &out->vocab, err);
    kv_gguf_str tpl;
    if (!st && kv_gguf_has(g, "tokenizer.chat_template") &&
        !(st = kv_gguf_get_str(g, "tokenizer.chat_template", &tpl, err))) {
        if (tpl.n > (1u << 20))
            st = kv_fail(err, KV_ERR_FORMAT, "tokenizer.chat_template: %llu bytes (kvlab reads "
                         "at most 1 MiB)", (unsigned long long)tpl.n);
        else if (!(out->chat_template = malloc(tpl.n + 1)))
            st = kv_fail(err, KV_ERR_NOMEM, "out of memory for the chat template");
        else {
            memcpy(out->chat_template, tpl.s, tpl.n);
            out->chat_template[tpl.n] = '\0';
        }
    }
    kv_gguf_close(g);
    if (!st && kv_vocab_size(out->vocab) != out->m.config.vocab_size)
        st = kv_fail(err, KV_ERR_FORMAT, "the tokenizer has %d tokens, the model's vocabulary %d",
                      kv_vocab_size(out->vocab), out->m.config.vocab_size);
    return st;
}

/* an embedded default by name: --default NAME, or --model NAME where NAME is one */
static int is_default_name(const char *name)
{
    for (int i = 0; kv_cli_defaults[i]; i++)
        if (!strcmp(name, kv_cli_defaults[i])) return 1;
    return 0;
}

int kv_cli_model_open(const kv_cli_model_args *a, kv_cli_model *out, const char **what,
                      kv_err *err)
{
    memset(out, 0, sizeof *out);
    *what = "--model";
    if (a->model && a->def)
        return kv_fail(err, KV_ERR_ARG, "give either --model or --default, not both");
    const char *def = a->def, *path = a->model, *tok_path = a->tokenizer;
    if (path && is_default_name(path)) def = path, path = NULL;
    if (!path && !def) def = a->fallback;
    if (!path && !def) return kv_fail(err, KV_ERR_ARG, "a model is required (--model FILE)");
    int st;
    if (def && a->storage != KV_WEIGHTS_F32) {
        *what = "--weights";
        return kv_fail(err, KV_ERR_ARG, "%s keeps a GGUF model's blocks; %s has fp32 weights "
                       "(f32 only)", kv_weights_storage_name(a->storage), def);
    }
    if (def) {
        out->source = KV_CLI_SRC_DEFAULT;
        snprintf(out->name, sizeof out->name, "%s", def);
        *what = def;
        if ((st = kv_cli_default_model(&out->m, def, err))) return st;
        if (a->text != KV_CLI_TEXT_NONE) { /* --tokenizer, else the embedded byte tokenizer */
            *what = tok_path ? tok_path : "byte tokenizer";
            st = tok_path ? kv_tokenizer_read(tok_path, out->m.config.vocab_size, &out->tok, err)
                          : kv_tokenizer_bytes(&out->tok, out->m.config.vocab_size, err);
            if (st) {
                kv_cli_model_close(out);
                return st;
            }
            out->have_tok = 1;
        }
        return KV_OK;
    }
    kv_cli_trained_files trained;
    char named[KV_CLI_PATH_MAX];
    out->source = KV_CLI_SRC_FILE;
    if (strcmp(path, "trained") != 0) { /* a fetched model's name (smollm2) becomes its file */
        if ((st = kv_cli_model_resolve(path, named, sizeof named, err))) return st;
        if (strcmp(named, path)) snprintf(out->name, sizeof out->name, "%s", path);
        path = named;
    }
    if (kv_model_path_is_gguf(path)) {
        if (tok_path) {
            *what = "--tokenizer";
            return kv_fail(err, KV_ERR_ARG, "a GGUF file carries its own tokenizer");
        }
        out->source = KV_CLI_SRC_GGUF;
        if (!out->name[0]) snprintf(out->name, sizeof out->name, "%s", path);
        *what = path;
        if ((st = open_gguf(path, a->text, a->storage, out, err))) kv_cli_model_close(out);
        return st;
    }
    if (a->storage != KV_WEIGHTS_F32) {
        *what = "--weights";
        return kv_fail(err, KV_ERR_ARG, "%s keeps a GGUF model's blocks; %s is an fp32 "
                       "checkpoint (f32 only)", kv_weights_storage_name(a->storage), path);
    }
    if (!strcmp(path, "trained")) {
        if ((st = kv_cli_trained(&trained, a->heldout, err))) return st;
        out->source = KV_CLI_SRC_TRAINED;
        snprintf(out->heldout, sizeof out->heldout, "%s", trained.heldout);
        path = trained.model;
        if (!tok_path) tok_path = trained.tokenizer;
    }
    snprintf(out->name, sizeof out->name, "%s", out->source == KV_CLI_SRC_TRAINED ? "trained" : path);
    *what = path;
    if ((st = kv_checkpoint_read(path, &out->m, err))) return st;
    if (!tok_path && a->text == KV_CLI_TEXT_NEED) {
        kv_cli_model_close(out);
        *what = "--tokenizer";
        return kv_fail(err, KV_ERR_ARG, "a checkpoint file needs its tokenizer (--tokenizer "
                       "FILE, llama2.c's tokenizer.bin) to read or write text");
    }
    if (tok_path && a->text != KV_CLI_TEXT_NONE) {
        *what = tok_path;
        if ((st = kv_tokenizer_read(tok_path, out->m.config.vocab_size, &out->tok, err))) {
            kv_cli_model_close(out);
            return st;
        }
        out->have_tok = 1;
    }
    return KV_OK;
}

void kv_cli_model_close(kv_cli_model *mdl)
{
    if (mdl->have_tok) kv_tokenizer_free(&mdl->tok);
    kv_vocab_free(mdl->vocab);
    free(mdl->chat_template);
    kv_model_free(&mdl->m);
    memset(mdl, 0, sizeof *mdl);
}

int kv_cli_model_has_text(const char *model)
{
    if (!model || is_default_name(model) || !strcmp(model, "trained") || !strcmp(model, "smollm2"))
        return 1;
    return kv_model_path_is_gguf(model);
}

int kv_cli_model_load(const char *cmd, const kv_cli_model_args *a, kv_cli_model *out)
{
    kv_err err = {{0}};
    const char *what = "--model";
    const int st = kv_cli_model_open(a, out, &what, &err);
    if (!st) return KV_EXIT_OK;
    if (st == KV_ERR_ARG && what[0] == '-') return kv_args_bad(cmd, what, "%s", err.msg);
    return kv_cli_fail(cmd, what, st, &err);
}

/* ---- the text codec --------------------------------------------------------------------- */

int kv_cli_has_text(const kv_cli_model *mdl) { return mdl->have_tok || mdl->vocab; }

int kv_cli_bos(const kv_cli_model *mdl)
{
    const int id = mdl->vocab ? kv_vocab_bos(mdl->vocab) : -1;
    return id >= 0 ? id : 1; /* llama2.c's <s> */
}

int kv_cli_eos(const kv_cli_model *mdl)
{
    const int id = mdl->vocab ? kv_vocab_eos(mdl->vocab) : -1;
    return id >= 0 ? id : 2; /* llama2.c's </s> */
}

int kv_cli_encode(const kv_cli_model *mdl, const char *text, int bos, int **ids, int *n,
                  kv_err *err)
{
    *ids = NULL;
    *n = 0;
    if (!kv_cli_has_text(mdl)) return kv_fail(err, KV_ERR_ARG, "%s has no tokenizer", mdl->name);
    const size_t len = strlen(text);
    if (len > (1u << 28)) return kv_fail(err, KV_ERR_ARG, "%zu bytes of text: too long", len);
    if (mdl->vocab) { /* every token is at least one byte: len ids, BOS and a space prefix */
        const int cap = (int)len + 3;
        int *v = malloc((size_t)cap * sizeof(int)); /* [len + 3] */
        if (!v) return kv_fail(err, KV_ERR_NOMEM, "out of memory for %d ids", cap);
        int st;
        if ((st = kv_vocab_encode(mdl->vocab, text, len, bos, 0, v, cap, n, err))) {
            free(v);
            *n = 0;
            return st;
        }
        *ids = v;
        return KV_OK;
    }
    int *v = malloc((len + 3) * sizeof(int)); /* [len + 3] as kv_tokenizer_encode asks */
    if (!v) return kv_fail(err, KV_ERR_NOMEM, "out of memory for %zu bytes of text", len);
    const int st = kv_tokenizer_encode(&mdl->tok, text, bos, 0, v, n, err);
    if (st) {
        free(v);
        *n = 0;
        return st;
    }
    *ids = v;
    return KV_OK;
}

int kv_cli_piece(const kv_cli_model *mdl, int prev, int id, char *buf, int cap)
{
    if (cap <= 0) return 0;
    buf[0] = '\0';
    if (mdl->vocab) { /* a control token (<|im_end|>, ...) is no text */
        if (kv_vocab_is_control(mdl->vocab, id)) return 0;
        int len = kv_vocab_piece(mdl->vocab, id, buf, cap - 1);
        len = len < 0 ? 0 : len > cap - 1 ? cap - 1 : len;
        buf[len] = '\0';
        return len;
    }
    if (!mdl->have_tok || id < 0 || id >= mdl->tok.vocab_size) return 0;
    char bytebuf[2];
    const char *s = kv_tokenizer_decode(&mdl->tok, prev, id, bytebuf);
    /* a <0x00> piece is one NUL byte: it has length 1 though strlen says 0 */
    int len = s == bytebuf ? 1 : (int)strlen(s);
    if (len > cap - 1) len = cap - 1;
    memcpy(buf, s, (size_t)len);
    buf[len] = '\0';
    return len;
}

int kv_cli_stop_ids(const kv_cli_model *mdl, int *ids, int cap)
{
    int n = 0;
    if (!mdl->vocab) {
        if (cap >= 2) ids[n++] = 1, ids[n++] = 2; /* llama2.c's BOS and EOS, as run.c */
        return n;
    }
    static const char *const ends[] = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>",
                                       "<|end_of_text|>"};
    if (kv_vocab_eos(mdl->vocab) >= 0 && n < cap) ids[n++] = kv_vocab_eos(mdl->vocab);
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        const int id = kv_vocab_find(mdl->vocab, ends[i]);
        int seen = id < 0;
        for (int j = 0; j < n && !seen; j++) seen = ids[j] == id;
        if (!seen && n < cap) ids[n++] = id;
    }
    return n;
}

void kv_cli_piece_name(const kv_cli_model *mdl, int id, char *buf, int cap)
{
    if (cap <= 0) return;
    int len = mdl->vocab ? kv_vocab_piece(mdl->vocab, id, buf, cap - 1) : -1;
    if (len < 0) len = snprintf(buf, (size_t)cap, "token %d", id);
    buf[len < cap - 1 ? len : cap - 1] = '\0';
}

int kv_cli_model_kv_heads(const char *cmd, const kv_model *m, int kv_heads, kv_model *conv,
                          const kv_model **out)
{
    kv_err err = {{0}};
    const int have = m->config.n_kv_heads;
    *out = m;
    if (!kv_heads || kv_heads == have) return KV_EXIT_OK;
    const int st = kv_heads < have ? kv_convert_pool_kv_heads(conv, m, kv_heads, &err)
                                   : kv_convert_expand_kv_heads(conv, m, kv_heads, &err);
    if (st) return kv_cli_fail(cmd, "--kv-heads", st, &err);
    *out = conv;
    return KV_EXIT_OK;
}
