/* Chat templates (kv_chat.h): ChatML and Llama 3 recognised in a GGUF file's Jinja text, and
 * a message rendered into ids, control tokens by id and the text between them encoded with
 * special = 0. */
#include "kv_chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* memmem without _GNU_SOURCE: the first @p needle in tpl [len], or NULL */
static const char *find(const char *tpl, size_t len, const char *needle)
{
    const size_t n = strlen(needle);
    for (size_t i = 0; n <= len && i <= len - n; i++)
        if (memcmp(tpl + i, needle, n) == 0) return tpl + i;
    return NULL;
}

/*
 * A ChatML template's default system message: the literal text between
 * "<|im_start|>system" + newline and "<|im_end|>" inside one Jinja string. The generic line
 * every message takes writes '<|im_start|>' + message['role'], so a literal
 * "<|im_start|>system" is the template writing a system message of its own. Accepted only when
 * the text between is plain string content (no closing quote, no Jinja braces); \n and \' in
 * it are unescaped. "" when there is none.
 */
static void default_system(const char *tpl, size_t len, char out[KV_CHAT_SYSTEM_MAX])
{
    out[0] = '\0';
    static const char head[] = "<|im_start|>system";
    for (const char *p = tpl; (p = find(p, len - (size_t)(p - tpl), head)); p += sizeof head - 1) {
        char quote = 0; /* the quote that opened the Jinja string holding the marker */
        for (const char *q = p; q > tpl && !quote; q--)
            if (q[-1] == '\'' || q[-1] == '"') quote = q[-1];
            else if (q[-1] == '{' || q[-1] == '}' || q[-1] == '\n') break;
        const char *s = p + sizeof head - 1, *end = tpl + len;
        if (s < end && *s == '\n') s++;
        else if (end - s >= 2 && s[0] == '\\' && s[1] == 'n') s += 2;
        else continue;
        const char *stop = find(s, (size_t)(end - s), "<|im_end|>");
        if (!quote || !stop) continue;
        size_t n = 0;
        int plain = 1;
        for (const char *c = s; c < stop && plain; c++) {
            char ch = *c;
            if (ch == '{' || ch == '}' || ch == quote) plain = 0;
            else if (ch == '\\' && c + 1 < stop) { /* a Jinja string escape */
                ch = c[1] == 'n' ? '\n' : c[1];
                c++;
            }
            if (plain && n + 1 < KV_CHAT_SYSTEM_MAX) out[n++] = ch;
        }
        out[plain ? n : 0] = '\0';
        if (plain && n) return;
    }
}

/* the id of control token @p text, or KV_ERR_FORMAT naming it; -1 without a vocabulary */
static int control(const kv_vocab *v, const char *text, int *id, kv_err *err)
{
    *id = -1;
    if (!v) return KV_OK;
    *id = kv_vocab_find(v, text);
    if (*id < 0)
        return kv_fail(err, KV_ERR_FORMAT, "the chat template uses %s, which the vocabulary "
                       "does not have", text);
    return KV_OK;
}

int kv_chat_template_parse(const char *tpl, size_t len, const kv_vocab *v, kv_chat_template *t,
                           kv_err *err)
{
    memset(t, 0, sizeof *t);
    t->header_end = t->begin = -1;
    int st;
    if (tpl && find(tpl, len, "<|im_start|>")) {
        t->format = KV_CHAT_CHATML;
        if ((st = control(v, "<|im_start|>", &t->msg_start, err)) ||
            (st = control(v, "<|im_end|>", &t->msg_end, err)))
            return st;
        default_system(tpl, len, t->default_system);
        return KV_OK;
    }
    if (tpl && find(tpl, len, "<|start_header_id|>")) {
        t->format = KV_CHAT_LLAMA3;
        if ((st = control(v, "<|start_header_id|>", &t->msg_start, err)) ||
            (st = control(v, "<|end_header_id|>", &t->header_end, err)) ||
            (st = control(v, "<|eot_id|>", &t->msg_end, err)) ||
            (st = control(v, "<|begin_of_text|>", &t->begin, err)))
            return st;
        return KV_OK;
    }
    /* the first 60 bytes, newlines shown as \n, so the message stays one line */
    char head[128];
    size_t n = 0;
    for (size_t i = 0; tpl && i < len && i < 60 && n + 3 < sizeof head; i++) {
        if (tpl[i] == '\n') head[n++] = '\\', head[n++] = 'n';
        else head[n++] = (unsigned char)tpl[i] < 32 ? '?' : tpl[i];
    }
    head[n] = '\0';
    return kv_fail(err, KV_ERR_UNSUPPORTED, "chat template not recognised (kvlab knows ChatML "
                   "and Llama 3); the template begins: %s%s", tpl && len ? head : "(empty)",
                   tpl && len > 60 ? "..." : "");
}

const char *kv_chat_format_name(int format)
{
    return format == KV_CHAT_CHATML ? "ChatML" : format == KV_CHAT_LLAMA3 ? "Llama 3" : "none";
}

/* ---- rendering ------------------------------------------------------------------------ */

static int put_id(int id, int *ids, int cap, int *n, kv_err *err)
{
    if (*n >= cap) return kv_fail(err, KV_ERR_CAPACITY, "chat: more than %d tokens", cap);
    ids[(*n)++] = id;
    return KV_OK;
}

/* the text a .. a + na followed by b .. b + nb, encoded as one piece with special = 0 */
static int put_text(const kv_vocab *v, const char *a, size_t na, const char *b, size_t nb,
                    int *ids, int cap, int *n, kv_err *err)
{
    if (na + nb == 0) return KV_OK;
    char *s = malloc(na + nb + 1);
    if (!s) return kv_fail(err, KV_ERR_NOMEM, "chat: out of memory for %zu bytes", na + nb);
    memcpy(s, a, na);
    if (nb) memcpy(s + na, b, nb);
    s[na + nb] = '\0';
    int got = 0;
    const int st = kv_vocab_encode(v, s, na + nb, 0, 0, ids + *n, cap - *n, &got, err);
    free(s);
    if (st == KV_ERR_CAPACITY || (!st && got > cap - *n))
        return kv_fail(err, KV_ERR_CAPACITY, "chat: more than %d tokens", cap);
    if (st) return st;
    *n += got;
    return KV_OK;
}

/* Llama 3's template trims a message's content (Jinja's | trim) */
static void trim(const char **s, size_t *len)
{
    static const char ws[] = " \t\n\r\v\f";
    while (*len && strchr(ws, (*s)[0])) ++*s, --*len;
    while (*len && strchr(ws, (*s)[*len - 1])) --*len;
}

int kv_chat_render_message(const kv_chat_template *t, const kv_vocab *v, int first,
                           const char *role, const char *content, size_t content_len, int *ids,
                           int cap, int *n, kv_err *err)
{
    int st;
    if (t->format == KV_CHAT_CHATML) {
        /* <|im_start|> role "\n" content <|im_end|> "\n" */
        char head[64];
        const size_t nh = (size_t)snprintf(head, sizeof head, "%s\n", role);
        if ((st = put_id(t->msg_start, ids, cap, n, err)) ||
            (st = put_text(v, head, nh, content, content_len, ids, cap, n, err)) ||
            (st = put_id(t->msg_end, ids, cap, n, err)) ||
            (st = put_text(v, "\n", 1, NULL, 0, ids, cap, n, err)))
            return st;
        return KV_OK;
    }
    if (t->format != KV_CHAT_LLAMA3)
        return kv_fail(err, KV_ERR_ARG, "kv_chat_render_message: no template");
    /* [<|begin_of_text|>] <|start_header_id|> role <|end_header_id|> "\n\n" content <|eot_id|> */
    trim(&content, &content_len);
    if ((first && (st = put_id(t->begin, ids, cap, n, err))) ||
        (st = put_id(t->msg_start, ids, cap, n, err)) ||
        (st = put_text(v, role, strlen(role), NULL, 0, ids, cap, n, err)) ||
        (st = put_id(t->header_end, ids, cap, n, err)) ||
        (st = put_text(v, "\n\n", 2, content, content_len, ids, cap, n, err)) ||
        (st = put_id(t->msg_end, ids, cap, n, err)))
        return st;
    return KV_OK;
}

int kv_chat_render_reply_start(const kv_chat_template *t, const kv_vocab *v, int *ids, int cap,
                               int *n, kv_err *err)
{
    int st;
    if ((st = put_id(t->msg_start, ids, cap, n, err))) return st;
    if (t->format == KV_CHAT_CHATML) return put_text(v, "assistant\n", 10, NULL, 0, ids, cap, n, err);
    if ((st = put_text(v, "assistant", 9, NULL, 0, ids, cap, n, err)) ||
        (st = put_id(t->header_end, ids, cap, n, err)))
        return st;
    return put_text(v, "\n\n", 2, NULL, 0, ids, cap, n, err);
}

int kv_chat_render_reply_end(const kv_chat_template *t, const kv_vocab *v, int ended, int *ids,
                             int cap, int *n, kv_err *err)
{
    int st;
    if (!ended && (st = put_id(t->msg_end, ids, cap, n, err))) return st;
    if (t->format == KV_CHAT_CHATML) return put_text(v, "\n", 1, NULL, 0, ids, cap, n, err);
    return KV_OK;
}

int kv_chat_render_prompt(const kv_chat_template *t, const kv_vocab *v, const char *system,
                          const char *text, size_t len, int *ids, int cap, int *n, kv_err *err)
{
    const char *sys = system && system[0] ? system : t->default_system;
    const int first = *n == 0;
    int st = KV_OK;
    if (sys[0]) st = kv_chat_render_message(t, v, first, "system", sys, strlen(sys), ids, cap, n, err);
    if (!st) st = kv_chat_render_message(t, v, first && !sys[0], "user", text, len, ids, cap, n, err);
    if (!st) st = kv_chat_render_reply_start(t, v, ids, cap, n, err);
    return st;
}
