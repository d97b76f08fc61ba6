/* Chapter 10 on a trained model (SmolLM2-135M-Instruct; realmodel, 77 when it is absent):
 * its first 16 layers, with the final norm and the tied classifier, draft for all 30 (its
 * first 2 or 8 layers agree with it on no token of this prompt: nothing would be accepted, and
 * only the rejection path would run; 16 agree on a few, so both paths run).
 *
 * Predicted before measured:
 *  - greedy speculation emits exactly the target's own greedy stream for every k, whatever
 *    the draft guesses: a draft token is kept only when it is the target's argmax at its
 *    position, and the verify step's rows equal one-token steps (test_spec holds that on the
 *    constructed models; here the weights are a real model's, the prompt a chat turn);
 *  - after each run the target caches the tokens a plain run caches, row for row, byte for
 *    byte: the rejected drafts were rolled back;
 *  - the counts obey their identity: target steps + accepted drafts = tokens emitted (each
 *    target step emits its own token after the accepted ones), greedy and sampled;
 *  - the one-turn prompt (kv_chat_render_prompt) is the ids a kv_chat session feeds for its
 *    first turn, and that session's first reply token is the greedy stream's first. */
#include "common/kv_test.h"
#include "common/kv_test_chat_model.h"
#include "common/kv_test_model.h"
#include "common/test_spec_common.h"

#include "kv_chat.h"
#include "kv_generate.h"
#include "kv_gguf.h"
#include "kv_gguf_model.h"
#include "kv_spec.h"
#include "kv_vocab.h"

#include <stdlib.h>
#include <string.h>

#define N 16      /* tokens to emit */
#define CAP 128   /* the prompt and the reply */
#define DRAFT 16  /* the draft's layers */

static const char QUESTION[] = "What is the capital of France?";

/* The same prompt through a kv_chat session: its ids and its first greedy reply token. */
static void same_as_chat(const kv_model *m, const kv_chat_template *t, const kv_vocab *v,
                         const int *prompt, int n, int first)
{
    kv_err e = {{0}};
    kv_backend *b = NULL;
    kv_chat c = {0};
    kv_chat_stats cs;
    int reply = -1;
    const kv_cache_spec spec = spec_cache_spec(0, KV_DTYPE_F32, CAP, 16);
    int st = kv_backend_cpu(&b, m, &spec, &e);
    if (!st) st = kv_chat_init(&c, b, t, v, NULL, &e);
    if (!st) st = kv_chat_turn(&c, QUESTION, strlen(QUESTION), 1, NULL, NULL, NULL, &reply, &cs, &e);
    KV_CHECK(st == KV_OK, "kv_chat turn: %s", e.msg);
    if (!st) {
        KV_CHECK(cs.fed == n && !memcmp(c.ids, prompt, sizeof(int) * n),
                 "kv_chat_render_prompt: %d ids, the session fed %d (or other ids)", n, cs.fed);
        KV_CHECK(reply == first, "the session's first reply token %d, the greedy stream's %d",
                 reply, first);
    }
    kv_chat_free(&c);
    kv_backend_destroy(b);
}

/* Greedy at k = 1, 3, 6 and sampled at k = 4 against the plain greedy run; *first its first
 * token (-1 when it did not run). */
static void spec_runs(const kv_model *m, const kv_model *dm, const int *prompt, int n, int *first)
{
    *first = -1;
    kv_err e = {{0}};
    kv_backend *plain = NULL, *t = NULL, *d = NULL;
    const kv_cache_spec spec = spec_cache_spec(0, KV_DTYPE_F32, CAP, 16);
    int st = kv_backend_cpu(&plain, m, &spec, &e);
    if (!st) st = kv_backend_cpu(&t, m, &spec, &e);
    if (!st) st = kv_backend_cpu(&d, dm, &spec, &e);
    KV_CHECK(st == KV_OK, "backends: %s", e.msg);
    int want[N], got[N];
    const kv_gen_opts go = {KV_MODE_CACHED, 0, N, NULL, NULL, NULL, NULL};
    if (!st) st = kv_generate(plain, prompt, n, &go, want, NULL, &e);
    KV_CHECK(st == KV_OK, "plain greedy run: %s", e.msg);
    if (st) goto done;
    const int L = plain->length(plain, 0);
    *first = want[0];
    int64_t accepted = 0, drafted = 0;
    static const int ks[] = {1, 3, 6};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        const kv_spec_opts o = {ks[i], N, 0, 0.0f, 1};
        kv_spec_stats s;
        st = kv_spec_generate(t, d, prompt, n, &o, got, &s, &e);
        KV_CHECK(st == KV_OK, "k=%d: %s", ks[i], e.msg);
        if (st) break;
        KV_CHECK(!memcmp(got, want, sizeof want), "k=%d: the accepted stream differs from the "
                 "target's greedy stream", ks[i]);
        KV_CHECK(t->length(t, 0) == L, "k=%d: target caches %d tokens, plain %d", ks[i],
                 t->length(t, 0), L);
        const long bad = rows_differ(kv_backend_cpu_cache(t), kv_backend_cpu_cache(plain), L);
        KV_CHECK(bad == 0, "k=%d: %ld kept rows/elements differ from the plain run", ks[i], bad);
        KV_CHECK(s.emitted == N && s.accepted <= s.drafted && s.target_steps + s.accepted == N,
                 "k=%d: emitted %lld, accepted %lld of %lld, %lld target steps", ks[i],
                 (long long)s.emitted, (long long)s.accepted, (long long)s.drafted,
                 (long long)s.target_steps);
        printf("greedy k=%d: %lld target steps for %d tokens, acceptance %.2f\n", ks[i],
               (long long)s.target_steps, N, kv_spec_acceptance(&s));
        accepted += s.accepted;
        drafted += s.drafted;
    }
    KV_CHECK(st || (accepted > 0 && accepted < drafted), "greedy: %lld of %lld drafts accepted: "
             "the runs must both keep and roll back drafts to test both", (long long)accepted,
             (long long)drafted);
    /* sampled: the same identity; the stream is the target's in distribution, not in ids */
    const kv_spec_opts o = {4, N, 0, 1.0f, 7};
    kv_spec_stats s;
    if (!st) st = kv_spec_generate(t, d, prompt, n, &o, got, &s, &e);
    KV_CHECK(st == KV_OK, "sampled: %s", e.msg);
    if (!st) {
        KV_CHECK(s.emitted == N && s.accepted <= s.drafted && s.target_steps + s.accepted == N &&
                     t->length(t, 0) == L,
                 "sampled k=4: emitted %lld, accepted %lld of %lld, %lld target steps, %d cached",
                 (long long)s.emitted, (long long)s.accepted, (long long)s.drafted,
                 (long long)s.target_steps, t->length(t, 0));
        printf("sampled k=4 (T = 1): %lld target steps, acceptance %.2f\n",
               (long long)s.target_steps, kv_spec_acceptance(&s));
    }
done:
    kv_backend_destroy(plain);
    kv_backend_destroy(t);
    kv_backend_destroy(d);
}

int main(void)
{
    char path[4096];
    if (!kv_test_model_path(KV_TEST_SMOLLM2, "smollm2", path, sizeof path)) return KV_TEST_SKIP;
    kv_test_chat c;
    kv_model dm;
    kv_err e = {{0}};
    int prompt[CAP], n = 0;
    int st = kv_test_chat_open(path, &c, &e);
    if (!st)
        st = kv_chat_render_prompt(&c.t, c.v, NULL, QUESTION, strlen(QUESTION), prompt, CAP, &n, &e);
    if (!st) st = kv_model_layer_prefix(&dm, &c.m, DRAFT, &e);
    KV_CHECK(st == KV_OK, "model %s: %s", path, e.msg);
    if (!st) {
        KV_CHECK(n > 8 && n + N <= CAP && prompt[0] == c.t.msg_start,
                 "the prompt: %d ids, the first %d", n, prompt[0]);
        int first;
        spec_runs(&c.m, &dm, prompt, n, &first);
        if (first >= 0) same_as_chat(&c.m, &c.t, c.v, prompt, n, first);
    }
    kv_test_chat_close(&c);
    return kv_test_finish();
}
