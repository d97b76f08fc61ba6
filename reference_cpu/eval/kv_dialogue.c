/* Multi-turn dialogues (kv_dialogue.h): the file format, rendering a turn into the recall
 * models' tokens, the incremental session and the from-scratch check. */
#include "kv_dialogue.h"
#include "kv_file.h"
#include "kv_rng.h"
#include "kv_sampler.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DLG_MAX_TURNS 1024
#define DLG_MAX_ITEMS 65536
#define DLG_MAX_RUN 65536
/* tokens a whole dialogue may render to (a cache's capacity limit): bounds the sums below */
#define DLG_MAX_TOKENS (1 << 24)

/* ---- parsing ---------------------------------------------------------------------------- */

static int parse_int(const char *w, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(w, &end, 10);
    if (errno || end == w || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

/* "k3=v7" -> key, value; "k3?" -> key; returns 0 on success */
static int parse_fact(const char *w, int *key, int *value)
{
    char buf[64];
    if (w[0] != 'k' || strlen(w) >= sizeof buf) return -1;
    snprintf(buf, sizeof buf, "%s", w + 1);
    char *eq = strchr(buf, '=');
    if (!eq || eq[1] != 'v') return -1;
    *eq = 0;
    if (parse_int(buf, 0, KV_RECALL_KEYS - 1, key)) return -1;
    return parse_int(eq + 2, 0, KV_RECALL_VALUES - 1, value);
}

int kv_dialogue_parse(const char *text, const char *name, kv_dialogue *d, kv_err *err)
{
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name ? name : "dialogue");
    d->seed = 1;
    kv_err e2; /* CR-only line endings would merge every turn into one */
    if (kv_text_check_lines(text, &e2)) return kv_fail(err, KV_ERR_FORMAT, "%s: %s", d->name, e2.msg);
    d->turns = calloc(DLG_MAX_TURNS, sizeof *d->turns);
    d->items = calloc(DLG_MAX_ITEMS, sizeof *d->items);
    if (!d->turns || !d->items) {
        kv_dialogue_free(d);
        return kv_fail(err, KV_ERR_NOMEM, "%s: out of memory", d->name);
    }
    int stated[KV_RECALL_KEYS]; /* value of each key stated so far, -1 none */
    for (int i = 0; i < KV_RECALL_KEYS; i++) stated[i] = -1;
    int line_no = 0, rc = KV_OK;
    int64_t n_tokens = 0; /* upper bound of the rendered length: 2 per turn, 2 per fact */
    const char *p = text;
    while (*p && !rc) {
        char line[4096];
        size_t n = strcspn(p, "\n");
        line_no++;
        if (n >= sizeof line) {
            rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: line too long", d->name, line_no);
            break;
        }
        memcpy(line, p, n);
        line[n] = 0;
        p += n + (p[n] == '\n');
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *words[512];
        int nw = 0;
        for (char *t = strtok(line, " \t\r"); t; t = strtok(NULL, " \t\r")) {
            if (nw == 512) break;
            words[nw++] = t;
        }
        if (nw == 512) {
            rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: more than 511 items in a turn", d->name,
                         line_no);
            break;
        }
        if (nw == 0) continue;
        if (!strcmp(words[0], "seed")) {
            int s = 0;
            if (nw != 2 || parse_int(words[1], 0, 1 << 30, &s))
                rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: 'seed N' wants one integer", d->name,
                             line_no);
            else
                d->seed = (uint64_t)s;
            continue;
        }
        if (d->n_turns == DLG_MAX_TURNS) {
            rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: more than %d turns", d->name, line_no,
                         DLG_MAX_TURNS);
            break;
        }
        kv_dlg_turn *t = &d->turns[d->n_turns];
        t->first_item = d->n_items;
        t->question_key = -1;
        t->expect_value = -1;
        t->line = line_no;
        for (int i = 0; i < nw && !rc; i++) {
            const char *w = words[i];
            kv_dlg_item it = {0};
            int wl = (int)strlen(w);
            if (t->question_key >= 0) {
                rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: '%s' after the question: a question "
                             "ends its turn", d->name, line_no, w);
                break;
            }
            if (w[0] == '~') {
                it.type = KV_DLG_FILLER_RUN;
                if (parse_int(w + 1, 1, DLG_MAX_RUN, &it.count))
                    rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: '%s': ~N wants N in 1..%d", d->name,
                                 line_no, w, DLG_MAX_RUN);
            } else if (w[0] == 'f') {
                it.type = KV_DLG_FILLER;
                if (parse_int(w + 1, 0, KV_RECALL_FILLERS - 1, &it.count))
                    rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: '%s': filler fN wants N in 0..%d",
                                 d->name, line_no, w, KV_RECALL_FILLERS - 1);
            } else if (w[0] == 'k' && wl >= 2 && w[wl - 1] == '?') {
                char buf[32];
                it.type = KV_DLG_QUESTION;
                snprintf(buf, sizeof buf, "%.*s", wl - 2, w + 1);
                if (wl > 30 || parse_int(buf, 0, KV_RECALL_KEYS - 1, &it.key))
                    rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: '%s': a question is kA? with A in "
                                 "0..%d", d->name, line_no, w, KV_RECALL_KEYS - 1);
                else if (stated[it.key] < 0)
                    rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: '%s' asks about k%d, which no "
                                 "earlier turn stated", d->name, line_no, w, it.key);
                else {
                    it.value = stated[it.key];
                    t->question_key = it.key;
                    t->expect_value = it.value;
                }
            } else if (w[0] == 'k') {
                it.type = KV_DLG_FACT;
                if (parse_fact(w, &it.key, &it.value))
                    rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: '%s': a fact is kA=vB with A in "
                                 "0..%d, B in 0..%d", d->name, line_no, w, KV_RECALL_KEYS - 1,
                                 KV_RECALL_VALUES - 1);
                else if (stated[it.key] >= 0)
                    rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: '%s': k%d was already stated (a "
                                 "key is stated once per dialogue)", d->name, line_no, w, it.key);
                else
                    stated[it.key] = it.value;
            } else {
                rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: unknown item '%s' (kA=vB, kA?, ~N, "
                             "fN)", d->name, line_no, w);
            }
            if (rc) break;
            if (d->n_items == DLG_MAX_ITEMS) {
                rc = kv_fail(err, KV_ERR_FORMAT, "%s: more than %d items", d->name,
                             DLG_MAX_ITEMS);
                break;
            }
            n_tokens += it.type == KV_DLG_FILLER_RUN ? it.count : 2;
            if (n_tokens + 2 * (int64_t)(d->n_turns + 1) > DLG_MAX_TOKENS) {
                rc = kv_fail(err, KV_ERR_FORMAT, "%s:%d: the dialogue is longer than %d tokens",
                             d->name, line_no, DLG_MAX_TOKENS);
                break;
            }
            d->items[d->n_items++] = it;
            t->n_items++;
        }
        d->n_turns++;
    }
    if (!rc && d->n_turns == 0) rc = kv_fail(err, KV_ERR_FORMAT, "%s: no turns", d->name);
    if (rc) kv_dialogue_free(d);
    return rc;
}

int kv_dialogue_read(const char *path, kv_dialogue *d, kv_err *err)
{
    memset(d, 0, sizeof *d);
    char *buf;
    int rc = kv_file_read_text(path, KV_DIALOGUE_MAX_BYTES, &buf, NULL, err);
    if (rc) return rc;
    rc = kv_dialogue_parse(buf, path, d, err);
    free(buf);
    return rc;
}

void kv_dialogue_free(kv_dialogue *d)
{
    if (!d) return;
    free(d->turns);
    free(d->items);
    d->turns = NULL;
    d->items = NULL;
    d->n_turns = d->n_items = 0;
}

/* ---- rendering -------------------------------------------------------------------------- */

int kv_dialogue_render(const kv_dialogue *d, int t, int kind, int *tokens, int max, int *n,
                       kv_err *err)
{
    kv_recall_vocab v;
    kv_recall_vocab_get(&v);
    if (t < 0 || t >= d->n_turns) return kv_fail(err, KV_ERR_ARG, "turn %d out of range", t);
    const kv_dlg_turn *turn = &d->turns[t];
    /* filler runs draw from (dialogue seed, turn): the same tokens for both model kinds */
    kv_rng r;
    kv_rng_seed(&r, d->seed * 1000003u + (uint64_t)t);
    int k = 0;
#define PUT(tok)                                                                                 \
    do {                                                                                         \
        if (k == max)                                                                            \
            return kv_fail(err, KV_ERR_CAPACITY, "%s:%d: turn needs more than %d tokens",        \
                           d->name, turn->line, max);                                            \
        tokens[k++] = (tok);                                                                     \
    } while (0)
    PUT(t == 0 ? v.bos : v.sep);
    for (int i = 0; i < turn->n_items; i++) {
        const kv_dlg_item *it = &d->items[turn->first_item + i];
        int tk[2], m = 0;
        switch (it->type) {
        case KV_DLG_FACT: m = kv_recall_fact_tokens(&v, kind, it->key, it->value, tk); break;
        case KV_DLG_QUESTION: m = kv_recall_question_tokens(&v, kind, it->key, tk); break;
        case KV_DLG_FILLER: tk[0] = v.filler0 + it->count; m = 1; break;
        case KV_DLG_FILLER_RUN:
            for (int j = 0; j < it->count; j++)
                PUT(v.filler0 + (int)(kv_rng_u32(&r) % v.n_fillers));
            break;
        }
        if (m < 0) return kv_fail(err, KV_ERR_ARG, "unknown model kind %d", kind);
        for (int j = 0; j < m; j++) PUT(tk[j]);
    }
#undef PUT
    *n = k;
    return KV_OK;
}

int kv_dialogue_expected(const kv_dialogue *d, int t)
{
    kv_recall_vocab v;
    kv_recall_vocab_get(&v);
    return d->turns[t].expect_value >= 0 ? v.value0 + d->turns[t].expect_value : v.ack;
}

int kv_dialogue_length(const kv_dialogue *d, int kind)
{
    int total = 0;
    for (int t = 0; t < d->n_turns; t++) {
        total += 2; /* "<s>" or "|", and the reply */
        for (int i = 0; i < d->turns[t].n_items; i++) {
            const kv_dlg_item *it = &d->items[d->turns[t].first_item + i];
            total += it->type == KV_DLG_FILLER_RUN ? it->count
                     : (it->type == KV_DLG_FACT && kind == KV_MODEL_RECALL_INDUCTION) ? 2
                                                                                     : 1;
        }
    }
    return total;
}

/* ---- the session ------------------------------------------------------------------------ */

int kv_session_open(kv_session *s, kv_backend *b, int slot, kv_err *err)
{
    memset(s, 0, sizeof *s);
    if (slot < 0 || slot >= b->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "session: slot %d outside [0, %d)", slot, b->spec.n_slots);
    s->b = b;
    s->slot = slot;
    s->cap = b->spec.capacity;
    s->history = malloc(sizeof(int) * (size_t)s->cap);
    s->logits = malloc(sizeof(float) * (size_t)b->config->vocab_size);
    if (!s->history || !s->logits) {
        kv_session_close(s);
        return kv_fail(err, KV_ERR_NOMEM, "session: out of memory");
    }
    b->reset(b, slot);
    return KV_OK;
}

/* prefill in chunks so a long turn never asks the backend for one huge step */
static int prefill(kv_backend *b, int slot, int pos, const int *tokens, int n, float *logits,
                   kv_err *err)
{
    const int chunk = 512;
    for (int done = 0; done < n; done += chunk) {
        const int m = n - done < chunk ? n - done : chunk;
        kv_seq s = {slot, pos + done, m, tokens + done};
        int rc = b->forward(b, &s, 1, done + m == n ? logits : NULL, NULL, err);
        if (rc) return rc;
    }
    return KV_OK;
}

int kv_session_turn(kv_session *s, const int *tokens, int n, int n_reply, int *reply,
                    kv_err *err)
{
    if (n < 1 || n_reply < 1) return kv_fail(err, KV_ERR_ARG, "session: empty turn or reply");
    if (s->n_history + n + n_reply > s->cap)
        return kv_fail(err, KV_ERR_CAPACITY, "session: %d cached + %d turn + %d reply tokens "
                       "exceed the capacity %d", s->n_history, n, n_reply, s->cap);
    /* the turn goes onto the cache the earlier turns left: only its tokens are computed */
    int rc = prefill(s->b, s->slot, s->n_history, tokens, n, s->logits, err);
    if (rc) return rc;
    memcpy(s->history + s->n_history, tokens, sizeof(int) * (size_t)n);
    s->n_history += n;
    const int V = s->b->config->vocab_size;
    for (int i = 0; i < n_reply; i++) {
        reply[i] = kv_argmax(s->logits, V);
        /* the reply is part of the history: forward it so the cache holds it too. The
         * logits of the last reply token are not needed (the next turn overwrites them). */
        kv_seq q = {s->slot, s->n_history, 1, &reply[i]};
        if (i + 1 < n_reply) rc = s->b->forward(s->b, &q, 1, s->logits, NULL, err);
        else rc = s->b->forward(s->b, &q, 1, NULL, NULL, err);
        if (rc) return rc;
        s->history[s->n_history++] = reply[i];
    }
    return KV_OK;
}

void kv_session_close(kv_session *s)
{
    free(s->history);
    free(s->logits);
    memset(s, 0, sizeof *s);
}

int kv_session_recompute(kv_backend *b, int slot, const int *history, int n, float *logits,
                         int *token, kv_err *err)
{
    b->reset(b, slot);
    int rc = prefill(b, slot, 0, history, n, logits, err);
    if (rc) return rc;
    *token = kv_argmax(logits, b->config->vocab_size);
    return KV_OK;
}

int kv_dialogue_run(kv_backend *b, const kv_dialogue *d, int kind, int recompute,
                    kv_dlg_result *res, kv_err *err)
{
    return kv_dialogue_run_hooked(b, d, kind, recompute, NULL, NULL, res, err);
}

int kv_dialogue_run_hooked(kv_backend *b, const kv_dialogue *d, int kind, int recompute,
                           kv_dlg_turn_fn on_turn, void *user, kv_dlg_result *res,
                           kv_err *err)
{
    if (recompute && b->spec.n_slots < 2)
        return kv_fail(err, KV_ERR_ARG, "dialogue: the recompute check needs a backend with 2 "
                       "slots");
    const int need = kv_dialogue_length(d, kind);
    if (need > b->spec.capacity)
        return kv_fail(err, KV_ERR_CAPACITY, "%s: needs %d cached tokens, capacity %d", d->name,
                       need, b->spec.capacity);
    const int V = b->config->vocab_size;
    int *tokens = malloc(sizeof(int) * (size_t)need);
    float *ref = malloc(sizeof(float) * (size_t)V); /* [V] from-scratch logits */
    kv_session s;
    int rc = (tokens && ref) ? kv_session_open(&s, b, 0, err)
                             : kv_fail(err, KV_ERR_NOMEM, "dialogue: out of memory");
    if (rc) {
        free(tokens);
        free(ref);
        return rc;
    }
    for (int t = 0; t < d->n_turns && !rc; t++) {
        kv_dlg_result *r = &res[t];
        memset(r, 0, sizeof *r);
        int n = 0;
        if ((rc = kv_dialogue_render(d, t, kind, tokens, need, &n, err))) break;
        if ((rc = kv_session_turn(&s, tokens, n, 1, &r->reply, err))) break;
        r->n_tokens = n;
        r->cached = s.n_history;
        r->expected = kv_dialogue_expected(d, t);
        r->pass = r->reply == r->expected;
        float best = -3.4e38f;
        for (int i = 0; i < V; i++)
            if (i != r->expected && s.logits[i] > best) best = s.logits[i];
        r->margin = s.logits[r->expected] - best;
        if (recompute) {
            /* everything before the reply, from scratch, in the other slot */
            rc = kv_session_recompute(b, 1, s.history, s.n_history - 1, ref, &r->recompute_token,
                                      err);
            if (rc) break;
            r->recomputed = 1;
            float diff = 0.0f;
            for (int i = 0; i < V; i++) {
                float e = s.logits[i] - ref[i];
                if (e < 0) e = -e;
                if (!(e <= diff)) diff = e; /* NaN propagates */
            }
            r->recompute_diff = diff;
        }
        if (on_turn) rc = on_turn(user, &s, t, err);
    }
    if (recompute) b->reset(b, 1);
    kv_session_close(&s);
    free(tokens);
    free(ref);
    return rc;
}
