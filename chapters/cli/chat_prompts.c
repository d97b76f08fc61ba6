/* Prompts of real text for a chat model: a chat script's user turns, or a text's slices asked
 * for a summary, each rendered as a one-turn conversation (chat_prompts.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_prompts.h"
#include "kv_chat_dialogue.h"
#include "kv_file.h"

int *kv_cli_prompts_add(kv_cli_prompts *p, int n, kv_err *err)
{
    int **ids = realloc(p->ids, sizeof *ids * (size_t)(p->n + 1));
    if (ids) p->ids = ids;
    int *len = ids ? realloc(p->len, sizeof *len * (size_t)(p->n + 1)) : NULL;
    if (len) p->len = len;
    int *row = len ? malloc(sizeof(int) * (size_t)(n > 0 ? n : 1)) : NULL;
    if (!row) {
        kv_fail(err, KV_ERR_NOMEM, "prompts: out of memory");
        return NULL;
    }
    p->ids[p->n] = row;
    p->len[p->n++] = n;
    return row;
}

void kv_cli_prompts_free(kv_cli_prompts *p)
{
    for (int i = 0; i < p->n; i++) free(p->ids[i]);
    free(p->ids);
    free(p->len);
    memset(p, 0, sizeof *p);
}

/* One message rendered into a new prompt of at most cap ids. */
static int add_message(kv_cli_prompts *p, const kv_chat_template *t, const kv_vocab *v,
                       const char *text, size_t len, int cap, const char *file, kv_err *err)
{
    int *ids = kv_cli_prompts_add(p, cap, err), n = 0;
    if (!ids) return KV_ERR_NOMEM;
    const int st = kv_chat_render_prompt(t, v, NULL, text, len, ids, cap, &n, err);
    p->len[p->n - 1] = n;
    if (st == KV_ERR_CAPACITY)
        return kv_fail(err, KV_ERR_CAPACITY, "%s: prompt %d is longer than %d tokens", file,
                       p->n, cap);
    return st;
}

/* A text's slices of @p lines lines, each asked for a summary. */
static int add_text(kv_cli_prompts *p, const kv_chat_template *t, const kv_vocab *v,
                    const char *path, int lines, int max, int cap, kv_err *err)
{
    static const char ask[] = "Summarise this text:\n\n";
    if (lines < 1) lines = 1;
    char *text = NULL;
    size_t n = 0;
    int st = kv_file_read_text(path, 64 << 20, &text, &n, err);
    char *msg = st ? NULL : malloc(sizeof ask + n);
    if (!st && !msg) st = kv_fail(err, KV_ERR_NOMEM, "prompts: out of memory");
    for (size_t at = 0; !st && at < n && (!max || p->n < max);) {
        size_t end = at;
        for (int k = 0; k < lines && end < n; k++) {
            const char *nl = memchr(text + end, '\n', n - end);
            end = nl ? (size_t)(nl - text) + 1 : n;
        }
        memcpy(msg, ask, sizeof ask - 1);
        memcpy(msg + sizeof ask - 1, text + at, end - at);
        st = add_message(p, t, v, msg, sizeof ask - 1 + end - at, cap, path, err);
        at = end;
    }
    free(msg);
    free(text);
    return st;
}

int kv_cli_prompts_files(const char *list, int lines, int max, int cap, const kv_cli_model *mdl,
                         kv_cli_prompts *p, kv_err *err)
{
    memset(p, 0, sizeof *p);
    if (!mdl->vocab || !mdl->chat_template)
        return kv_fail(err, KV_ERR_ARG, "%s has no chat template (tokenizer.chat_template): "
                       "prompts of real text need a chat model", mdl->name);
    kv_chat_template t;
    int st = kv_chat_template_parse(mdl->chat_template, strlen(mdl->chat_template), mdl->vocab,
                                    &t, err);
    for (const char *f = list; !st && *f && (!max || p->n < max);) {
        const size_t len = strcspn(f, ",");
        char path[KV_CLI_PATH_MAX];
        if (len >= sizeof path) {
            st = kv_fail(err, KV_ERR_ARG, "a path of %zu characters", len);
            break;
        }
        memcpy(path, f, len);
        path[len] = 0;
        f += len + (f[len] == ',');
        if (len > 5 && !strcmp(path + len - 5, ".chat")) {
            kv_chat_script s;
            if ((st = kv_chat_script_read(path, &s, err))) break;
            for (int i = 0; !st && i < s.n_turns && (!max || p->n < max); i++)
                st = add_message(p, &t, mdl->vocab, s.turns[i].text, s.turns[i].len, cap, path,
                                 err);
            kv_chat_script_free(&s);
        } else {
            st = add_text(p, &t, mdl->vocab, path, lines, max, cap, err);
        }
    }
    if (!st && !p->n) st = kv_fail(err, KV_ERR_ARG, "no prompts in '%s'", list);
    for (int i = 0; !st && i < p->n; i++) p->longest = p->len[i] > p->longest ? p->len[i] : p->longest;
    if (st) kv_cli_prompts_free(p);
    return st;
}
