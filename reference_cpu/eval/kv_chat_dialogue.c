/* Scripted conversations for a chat model's multi-turn memory (kv_chat_dialogue.h): the parser
 * cuts the script's text in place into turns and facts; the runner feeds the turns to kv_chat
 * one by one and checks each ask's reply against its fact's value. */
#include "kv_chat_dialogue.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_file.h"

#define CD_MAX_TURNS 256

void kv_chat_script_free(kv_chat_script *s)
{
    free(s->buf);
    free(s->turns);
    free(s->facts);
    memset(s, 0, sizeof *s);
}

/* the text with spaces trimmed at both ends (cut in place) */
static char *trim(char *p)
{
    while (*p == ' ' || *p == '\t') p++;
    char *e = p + strlen(p);
    while (e > p && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = '\0';
    return p;
}

static int find_fact(const kv_chat_script *s, const char *name)
{
    for (int i = 0; i < s->n_facts; i++)
        if (!strcmp(s->facts[i].name, name)) return i;
    return -1;
}

/* "fact NAME: VALUE" */
static int parse_fact(kv_chat_script *s, char *rest, int line, kv_err *err)
{
    char *colon = strchr(rest, ':');
    if (!colon) return kv_fail(err, KV_ERR_FORMAT, "%s:%d: a fact is 'fact NAME: VALUE'",
                               s->name, line);
    *colon = '\0';
    const char *name = trim(rest), *value = trim(colon + 1);
    if (!s->n_turns)
        return kv_fail(err, KV_ERR_FORMAT, "%s:%d: fact '%s' has no turn above it to state it",
                       s->name, line, name);
    if (!name[0] || !value[0] || strlen(name) >= KV_CD_NAME || strlen(value) >= KV_CD_VALUE)
        return kv_fail(err, KV_ERR_FORMAT, "%s:%d: a fact's name (1..%d bytes) and value "
                       "(1..%d bytes)", s->name, line, KV_CD_NAME - 1, KV_CD_VALUE - 1);
    if (find_fact(s, name) >= 0)
        return kv_fail(err, KV_ERR_FORMAT, "%s:%d: fact '%s' is stated twice", s->name, line,
                       name);
    kv_cd_fact *f = &s->facts[s->n_facts++];
    snprintf(f->name, sizeof f->name, "%s", name);
    snprintf(f->value, sizeof f->value, "%s", value);
    f->turn = s->n_turns - 1;
    return KV_OK;
}

/* "ask NAME | QUESTION | OPENING" */
static int parse_ask(kv_chat_script *s, char *rest, int line, kv_cd_turn *t, kv_err *err)
{
    char *bar1 = strchr(rest, '|'), *bar2 = bar1 ? strchr(bar1 + 1, '|') : NULL;
    if (!bar2) return kv_fail(err, KV_ERR_FORMAT, "%s:%d: an ask is 'ask NAME | QUESTION | "
                              "OPENING'", s->name, line);
    *bar1 = *bar2 = '\0';
    const char *name = trim(rest);
    t->text = trim(bar1 + 1);
    t->len = strlen(t->text);
    t->opening = trim(bar2 + 1);
    t->ask = find_fact(s, name);
    if (t->ask < 0)
        return kv_fail(err, KV_ERR_FORMAT, "%s:%d: ask of fact '%s', which no earlier line "
                       "states", s->name, line, name);
    if (!t->len) return kv_fail(err, KV_ERR_FORMAT, "%s:%d: an ask without a question",
                                s->name, line);
    return KV_OK;
}

int kv_chat_script_parse(const char *text, const char *name, kv_chat_script *s, kv_err *err)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->buf = strdup(text);
    s->turns = calloc(CD_MAX_TURNS, sizeof *s->turns);
    s->facts = calloc(CD_MAX_TURNS, sizeof *s->facts);
    if (!s->buf || !s->turns || !s->facts) {
        kv_chat_script_free(s);
        return kv_fail(err, KV_ERR_NOMEM, "%s: out of memory", name);
    }
    int rc = KV_OK, line = 0;
    char *p = s->buf;
    while (*p && !rc) {
        char *l = p, *nl = strchr(p, '\n');
        p = nl ? nl + 1 : p + strlen(p);
        if (nl) *nl = '\0';
        line++;
        l = trim(l);
        if (!l[0] || l[0] == '#') continue;
        if (s->n_turns == CD_MAX_TURNS || s->n_facts == CD_MAX_TURNS) {
            rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: more than %d turns or facts", name, line,
                         CD_MAX_TURNS);
        } else if (!strncmp(l, "fact ", 5)) {
            rc = parse_fact(s, l + 5, line, err);
        } else if (!strncmp(l, "ask ", 4)) {
            kv_cd_turn *t = &s->turns[s->n_turns];
            t->line = line;
            if (!(rc = parse_ask(s, l + 4, line, t, err))) s->n_turns++;
        } else if (!strncmp(l, "user:", 5)) {
            kv_cd_turn *t = &s->turns[s->n_turns++];
            t->line = line;
            t->ask = -1;
            t->text = trim(l + 5);
            if (strcmp(t->text, "\"\"\"") == 0) { /* a block: up to the closing """ line */
                char *end = strstr(p, "\n\"\"\"");
                if (!strncmp(p, "\"\"\"", 3) || !end) {
                    rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: a \"\"\" block, empty or without "
                                 "its closing \"\"\" line", name, line);
                    break;
                }
                *end = '\0';
                t->text = p;
                for (char *q = p; *q; q++) line += *q == '\n';
                line += 2; /* the block's last line and the closing """ */
                p = end + 1;
                p += strcspn(p, "\n");
                if (*p) p++;
            }
            t->len = strlen(t->text);
            if (!t->len) rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: an empty turn", name, line);
        } else {
            rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: a line is 'user: TEXT', 'fact NAME: "
                         "VALUE' or 'ask NAME | QUESTION | OPENING'", name, line);
        }
    }
    if (!rc && !s->n_turns) rc = kv_fail(err, KV_ERR_FORMAT, "%s: no turn", name);
    if (rc) kv_chat_script_free(s);
    return rc;
}

int kv_chat_script_read(const char *path, kv_chat_script *s, kv_err *err)
{
    char *text = NULL;
    size_t n = 0;
    int rc = kv_file_read_text(path, 1 << 20, &text, &n, err);
    if (!rc) rc = kv_chat_script_parse(text, path, s, err);
    free(text);
    return rc;
}

int kv_cd_match(const char *text, const char *value)
{
    const size_t n = strlen(value);
    if (!n) return 0;
    for (const char *p = text; *p; p++) {
        size_t i = 0;
        while (i < n && p[i] && tolower((unsigned char)p[i]) == tolower((unsigned char)value[i]))
            i++;
        if (i == n) return 1;
    }
    return 0;
}

/* the reply's text: its tokens' pieces, the end-of-turn token left out */
static void reply_text(const kv_chat *c, const kv_cd_result *r, char *buf, size_t cap)
{
    size_t k = 0;
    for (int i = 0; i < r->n_reply && k + 1 < cap; i++) {
        if (r->reply[i] == c->t->msg_end) break;
        char piece[64];
        int n = kv_vocab_piece(c->v, r->reply[i], piece, (int)sizeof piece);
        if (n <= 0) continue;
        if (k + (size_t)n >= cap) n = (int)(cap - 1 - k);
        memcpy(buf + k, piece, (size_t)n);
        k += (size_t)n;
    }
    buf[k] = '\0';
}

int kv_chat_script_run(kv_chat *c, const kv_chat_script *s, int max_reply, int max_answer,
                       void (*on_turn)(void *user, int turn), void *user, kv_cd_result *res,
                       kv_err *err)
{
    if (max_reply < 1 || max_reply > KV_CD_REPLY || max_answer < 1 || max_answer > KV_CD_REPLY)
        return kv_fail(err, KV_ERR_ARG, "reply lengths %d and %d: 1..%d tokens", max_reply,
                       max_answer, KV_CD_REPLY);
    kv_chat_reset(c);
    for (int t = 0; t < s->n_turns; t++) {
        const kv_cd_turn *tu = &s->turns[t];
        kv_cd_result *r = &res[t];
        memset(r, 0, sizeof *r);
        r->start = c->n_ids;
        r->ask = tu->ask;
        kv_chat_stats st;
        int rc = kv_chat_turn_opened(c, tu->text, tu->len, tu->ask >= 0 ? tu->opening : NULL,
                                     tu->ask >= 0 ? max_answer : max_reply, NULL, NULL, NULL,
                                     r->reply, &st, err);
        if (rc) {
            char why[sizeof err->msg];
            memcpy(why, err->msg, sizeof why);
            return kv_fail(err, rc, "%s, turn %d (line %d): %s", s->name, t + 1, tu->line, why);
        }
        r->n_reply = st.n_reply;
        r->prefix_hit = st.prefix_hit;
        r->fed = st.fed;
        reply_text(c, r, r->text, sizeof r->text);
        if (tu->ask >= 0) {
            const kv_cd_fact *f = &s->facts[tu->ask];
            r->distance = t - f->turn;
            r->distance_tokens = r->start - res[f->turn].start;
            r->pass = kv_cd_match(r->text, f->value);
        }
        if (on_turn) on_turn(user, t);
    }
    return KV_OK;
}
