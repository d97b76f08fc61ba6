/* A conversation over one cache slot (kv_chat.h).
 *
 * The conversation is one list of ids, ids [n_ids]. The cache holds its first n_cached; the
 * rest wait to be fed. After a reply the last chosen token waits too (a token is fed only to
 * choose the one after it), so a turn feeds
 *     [last reply token] + the reply's closing text + the user's message + the reply header
 * at positions n_cached.. on top of the cache, then one token per step until the end-of-turn
 * token, max_tokens, or a full cache. With recompute, the slot is emptied first and the whole
 * list is fed from position 0: the same ids at the same positions. */
#include "kv_chat.h"
#include "kv_paged.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kv_chat_init(kv_chat *c, kv_backend *b, const kv_chat_template *t, const kv_vocab *v,
                 const char *system, kv_err *err)
{
    memset(c, 0, sizeof *c);
    if (!b || !t || !v) return kv_fail(err, KV_ERR_ARG, "kv_chat_init: NULL argument");
    if (system && strlen(system) >= KV_CHAT_SYSTEM_MAX)
        return kv_fail(err, KV_ERR_ARG, "the system message is longer than %d bytes",
                       KV_CHAT_SYSTEM_MAX - 1);
    c->b = b;
    c->t = t;
    c->v = v;
    c->cap = b->spec.capacity;
    c->last_end = -1;
    snprintf(c->system, sizeof c->system, "%s", system && system[0] ? system : t->default_system);
    c->ids = malloc((size_t)c->cap * sizeof(int));                         /* [capacity] */
    c->logits = malloc((size_t)b->config->vocab_size * sizeof(float));  /* [vocab] */
    if (!c->ids || !c->logits) {
        kv_chat_free(c);
        return kv_fail(err, KV_ERR_NOMEM, "kv_chat_init: out of memory");
    }
    b->reset(b, 0);
    return KV_OK;
}

void kv_chat_reset(kv_chat *c)
{
    c->n_ids = c->n_cached = 0;
    c->last_end = -1;
    c->b->reset(c->b, 0);
}

void kv_chat_free(kv_chat *c)
{
    free(c->ids);
    free(c->logits);
    c->ids = NULL;
    c->logits = NULL;
}

/* Feed ids [from, to) at positions from.. and leave the last one's logits in c->logits. */
static int feed(kv_chat *c, int from, int to, kv_err *err)
{
    kv_seq seq = {0, from, to - from, c->ids + from};
    kv_counters cnt = {0};
    int st = c->b->forward(c->b, &seq, 1, c->logits, &cnt, err);
    if (!st) st = kv_logits_check(c->logits, c->b->config->vocab_size, err);
    if (!st) c->n_cached = to;
    return st;
}

int kv_chat_turn(kv_chat *c, const char *text, size_t len, int max_tokens, kv_sampler *sampler,
                 kv_chat_token_fn on_token, void *user, int *reply, kv_chat_stats *st,
                 kv_err *err)
{
    return kv_chat_turn_opened(c, text, len, NULL, max_tokens, sampler, on_token, user, reply,
                               st, err);
}

int kv_chat_turn_opened(kv_chat *c, const char *text, size_t len, const char *opening,
                        int max_tokens, kv_sampler *sampler, kv_chat_token_fn on_token,
                        void *user, int *reply, kv_chat_stats *st, kv_err *err)
{
    memset(st, 0, sizeof *st);
    if (max_tokens < 1) return kv_fail(err, KV_ERR_ARG, "kv_chat_turn: max_tokens %d", max_tokens);
    /* render what is new after the ids so far; on any failure the conversation is unchanged */
    int n = c->n_ids, rc = KV_OK;
    if (c->last_end >= 0)
        rc = kv_chat_render_reply_end(c->t, c->v, c->last_end, c->ids, c->cap, &n, err);
    if (!rc && c->n_ids == 0 && c->system[0])
        rc = kv_chat_render_message(c->t, c->v, 1, "system", c->system, strlen(c->system),
                                    c->ids, c->cap, &n, err);
    if (!rc)
        rc = kv_chat_render_message(c->t, c->v, n == 0, "user", text, len, c->ids, c->cap, &n,
                                    err);
    if (!rc) rc = kv_chat_render_reply_start(c->t, c->v, c->ids, c->cap, &n, err);
    if (!rc && opening && opening[0]) { /* the reply's first words, as plain text */
        int k = 0;
        rc = kv_vocab_encode(c->v, opening, strlen(opening), 0, 0, c->ids + n, c->cap - n, &k,
                             err);
        if (!rc) n += k;
        else if (rc == KV_ERR_CAPACITY) n = c->cap;
    }
    if (rc == KV_ERR_CAPACITY || (!rc && n >= c->cap)) /* n: as far as the rendering got */
        return kv_fail(err, KV_ERR_CAPACITY, "the context is full: the conversation holds %d of "
                       "the %d tokens the cache holds, and this message needs %s%d more (/reset "
                       "starts again)", c->n_ids, c->cap, rc ? "over " : "", n - c->n_ids + !!rc);
    if (rc) return rc;

    /* prefill: the new tokens on top of the cache, or everything from position 0 */
    if (c->recompute) {
        c->b->reset(c->b, 0);
        c->n_cached = 0;
    }
    /* an empty slot adopts the longest prefix a paged cache with prefix caching holds (the
     * system message other conversations wrote); at least the last token is fed, for its
     * logits. Off, or a contiguous cache: nothing adopted. */
    if (c->n_cached == 0 && c->b->mem) {
        int hit = 0;
        if ((rc = kv_paged_match_prefix(c->b->mem, 0, c->ids, n - 1, &hit, err))) return rc;
        c->n_cached = st->prefix_hit = hit;
    }
    st->reused = c->n_cached;
    st->fed = n - c->n_cached;
    double t0 = kv_now();
    const int before = c->n_ids;
    c->n_ids = n;
    if ((rc = feed(c, c->n_cached, n, err))) {
        c->n_ids = before; /* the cache may hold part of it: drop back to what is certain */
        return rc;
    }
    st->prefill_s = kv_now() - t0;

    /* the reply: choose, hand out, feed, until the end of the turn */
    t0 = kv_now();
    const int vocab = c->b->config->vocab_size;
    st->end = KV_CHAT_MAX_TOKENS;
    for (int i = 0; i < max_tokens; i++) {
        const int tok = sampler ? kv_sample(sampler, c->logits) : kv_argmax(c->logits, vocab);
        c->ids[c->n_ids++] = tok;
        if (reply) reply[i] = tok;
        st->n_reply = i + 1;
        if (on_token) on_token(user, tok);
        if (tok == c->t->msg_end) {
            st->end = KV_CHAT_END_TURN;
            break;
        }
        if (i + 1 == max_tokens) break;
        if (c->n_ids >= c->cap) { /* no room to feed it and choose another */
            st->end = KV_CHAT_CONTEXT_FULL;
            break;
        }
        if ((rc = feed(c, c->n_ids - 1, c->n_ids, err))) return rc;
        st->decode_steps++;
    }
    st->decode_s = kv_now() - t0;
    c->last_end = st->end == KV_CHAT_END_TURN;
    st->cached = c->n_cached;
    return KV_OK;
}
