/*
 * The one model loader of the kvlab commands (model_load.h): an embedded default, `trained`,
 * or a checkpoint file, each with its text codec. A command asks for a model once, by what it
 * was given, and never reads a checkpoint or a tokenizer itself.
 */
#include "model_load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_checkpoint.h"

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
    if (def) {
        if (tok_path) {
            *what = "--tokenizer";
            return kv_fail(err, KV_ERR_ARG, "the embedded model %s has the byte tokenizer; "
                           "--tokenizer goes with a checkpoint file", def);
        }
        out->source = KV_CLI_SRC_DEFAULT;
        snprintf(out->name, sizeof out->name, "%s", def);
        *what = def;
        if ((st = kv_cli_default_model(&out->m, def, err))) return st;
        if (a->text != KV_CLI_TEXT_NONE) {
            if ((st = kv_tokenizer_bytes(&out->tok, out->m.config.vocab_size, err))) {
                kv_cli_model_close(out);
                return st;
            }
            out->have_tok = 1;
        }
        return KV_OK;
    }
    kv_cli_trained_files trained;
    out->source = KV_CLI_SRC_FILE;
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
    kv_model_free(&mdl->m);
    memset(mdl, 0, sizeof *mdl);
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

int kv_cli_has_text(const kv_cli_model *mdl) { return mdl->have_tok; }

int kv_cli_bos(const kv_cli_model *mdl)
{
    (void)mdl;
    return 1; /* llama2.c's <s> */
}

int kv_cli_eos(const kv_cli_model *mdl)
{
    (void)mdl;
    return 2; /* llama2.c's </s> */
}

int kv_cli_encode(const kv_cli_model *mdl, const char *text, int bos, int **ids, int *n,
                  kv_err *err)
{
    *ids = NULL;
    *n = 0;
    if (!mdl->have_tok) return kv_fail(err, KV_ERR_ARG, "%s has no tokenizer", mdl->name);
    const size_t len = strlen(text);
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
