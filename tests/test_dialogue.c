/* Multi-turn consistency (issue 4): the dialogue format, rendering, and every dialogue in
 * datasets/dialogues on both recall models with an exact cache: each reply is the expected one
 * (the value for a question, "ok" otherwise) and equals a from-scratch recompute of the whole
 * history (identical token; logits compared too).
 *
 *   test_dialogue DATASETS/dialogues  */
#include "kv_test.h"

#include "kv_dialogue.h"

#include <string.h>

static kv_recall_vocab V;

static const char *const FILES[] = {"early-facts.dlg", "interleaved.dlg", "long-filler.dlg",
                                    "dense.dlg", "shared-values.dlg", "boundaries.dlg"};
#define N_FILES 6

static void test_parse(void)
{
    kv_dialogue d;
    kv_err e;
    const char *text = "# hello\nseed 5\nk1=v2 ~3 f7\n~2\nk1?\n";
    KV_CHECK(kv_dialogue_parse(text, "t", &d, &e) == KV_OK, "parse: %s", e.msg);
    KV_CHECK(d.n_turns == 3 && d.seed == 5 && d.n_items == 5, "turns %d items %d", d.n_turns,
             d.n_items);
    KV_CHECK(d.turns[2].question_key == 1 && d.turns[2].expect_value == 2, "question expects v2");
    KV_CHECK(kv_dialogue_expected(&d, 0) == V.ack && kv_dialogue_expected(&d, 2) == V.value0 + 2,
             "expected replies");
    int tok[32], n;
    KV_CHECK(kv_dialogue_render(&d, 0, KV_MODEL_RECALL_INDUCTION, tok, 32, &n, &e) == KV_OK &&
                 n == 7 && tok[0] == V.bos && tok[1] == V.key0 + 1 && tok[2] == V.value0 + 2 &&
                 tok[6] == V.filler0 + 7, "induction rendering (n %d)", n);
    int tok2[32], n2;
    kv_dialogue_render(&d, 0, KV_MODEL_RECALL_DIRECT, tok2, 32, &n2, &e);
    KV_CHECK(n2 == 6 && tok2[1] == V.fact0 + 1 * 16 + 2 && !memcmp(tok + 3, tok2 + 2, 3 * sizeof(int)),
             "direct rendering: one fact token, the same filler run");
    kv_dialogue_render(&d, 2, KV_MODEL_RECALL_DIRECT, tok2, 32, &n2, &e);
    KV_CHECK(n2 == 2 && tok2[0] == V.sep && tok2[1] == V.query0 + 1, "question turn");
    KV_CHECK(kv_dialogue_render(&d, 0, KV_MODEL_RECALL_INDUCTION, tok, 4, &n, &e) ==
                 KV_ERR_CAPACITY, "too small a buffer refused");
    KV_CHECK(kv_dialogue_length(&d, KV_MODEL_RECALL_INDUCTION) == 7 + 1 + 3 + 1 + 2 + 1,
             "length %d", kv_dialogue_length(&d, KV_MODEL_RECALL_INDUCTION));
    kv_dialogue_free(&d);

    const char *bad[] = {"k1?\n",              /* never stated */
                         "k1=v2\nk1=v3\n",     /* stated twice */
                         "k1=v2 k1? ~3\n",     /* item after the question */
                         "k1=v2 hello\n",      /* unknown item */
                         "k16=v2\n",           /* key out of range */
                         "k1=v16\n",           /* value out of range */
                         "~0\n",               /* empty filler run */
                         "f64\n",              /* filler out of range */
                         "seed x\n",           /* bad seed */
                         "# only a comment\n"}; /* no turns */
    for (int i = 0; i < 10; i++) {
        int rc = kv_dialogue_parse(bad[i], "bad", &d, &e);
        KV_CHECK(rc == KV_ERR_FORMAT, "bad dialogue %d refused (rc %d): %s", i, rc, e.msg);
        if (i < 9) KV_CHECK(strstr(e.msg, "bad:") != NULL, "message names the line: %s", e.msg);
    }
}

/* Session API by hand: the cache holds exactly the history after every turn. */
static void test_session(const kv_model *m)
{
    kv_backend *b;
    kv_err e;
    kv_cache_spec sp = kv_cache_spec_default(1, 64);
    if (kv_backend_cpu(&b, m, &sp, &e)) {
        KV_CHECK(0, "backend: %s", e.msg);
        return;
    }
    kv_session s;
    KV_CHECK(kv_session_open(&s, b, 0, &e) == KV_OK, "open");
    int t1[] = {V.bos, V.key0 + 4, V.value0 + 9, V.filler0, V.filler0 + 1}, r1;
    int t2[] = {V.sep, V.filler0 + 5, V.key0 + 4}, r2[2];
    KV_CHECK(kv_session_turn(&s, t1, 5, 1, &r1, &e) == KV_OK, "turn 1: %s", e.msg);
    KV_CHECK(r1 == V.ack && s.n_history == 6 && b->length(b, 0) == 6, "turn 1 reply ok, 6 cached");
    KV_CHECK(kv_session_turn(&s, t2, 3, 2, r2, &e) == KV_OK, "turn 2: %s", e.msg);
    KV_CHECK(r2[0] == V.value0 + 9 && s.n_history == 11 && b->length(b, 0) == 11,
             "turn 2 answers v9 (got %d), 11 cached", r2[0]);
    int big[60] = {0};
    KV_CHECK(kv_session_turn(&s, big, 60, 1, &r1, &e) == KV_ERR_CAPACITY, "over capacity refused");
    kv_session_close(&s);
    kv_backend_destroy(b);
}

static void test_datasets(const char *dir, kv_model *models)
{
    for (int f = 0; f < N_FILES; f++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, FILES[f]);
        kv_dialogue d;
        kv_err e;
        if (kv_dialogue_read(path, &d, &e)) {
            KV_CHECK(0, "%s", e.msg);
            continue;
        }
        int questions = 0, first_q = -1, last_q = -1;
        for (int t = 0; t < d.n_turns; t++)
            if (d.turns[t].question_key >= 0) {
                questions++;
                if (first_q < 0) first_q = t;
                last_q = t;
            }
        KV_CHECK(d.n_turns >= 12 && questions >= 3 && last_q >= 10,
                 "%s: %d turns (>= 12), %d questions, last in turn %d (>= 10)", FILES[f],
                 d.n_turns, questions, last_q + 1);
        for (int k = 0; k < 2; k++) {
            const int kind = k ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT;
            kv_backend *b;
            kv_cache_spec sp = kv_cache_spec_default(2, kv_dialogue_length(&d, kind));
            if (kv_backend_cpu(&b, &models[k], &sp, &e)) {
                KV_CHECK(0, "backend: %s", e.msg);
                continue;
            }
            kv_dlg_result *res = calloc(d.n_turns, sizeof *res);
            int rc = kv_dialogue_run(b, &d, kind, 1, res, &e);
            KV_CHECK(rc == KV_OK, "%s: %s", FILES[f], e.msg);
            int pass = 0;
            float worst = 0.0f, min_margin = 1e9f;
            for (int t = 0; t < d.n_turns && !rc; t++) {
                const kv_dlg_result *r = &res[t];
                char b1[32], b2[32];
                pass += r->pass;
                if (r->margin < min_margin) min_margin = r->margin;
                if (r->recompute_diff > worst) worst = r->recompute_diff;
                KV_CHECK(r->pass, "%s (%s) turn %d: reply %s, expected %s", FILES[f],
                         kv_recall_kind_name(kind), t + 1, kv_recall_token_name(&V, r->reply, b1),
                         kv_recall_token_name(&V, r->expected, b2));
                KV_CHECK(r->recomputed && r->recompute_token == r->reply,
                         "%s (%s) turn %d: incremental %d vs from scratch %d", FILES[f],
                         kv_recall_kind_name(kind), t + 1, r->reply, r->recompute_token);
                /* the same rows in the same order: fp32 tolerance, not a looser one */
                KV_CHECK(r->recompute_diff <= KV_TOL_F32_ATOL + KV_TOL_F32_RTOL * 10.0,
                         "%s turn %d: logits differ by %g from scratch", FILES[f], t + 1,
                         r->recompute_diff);
            }
            printf("%-18s %-9s %2d/%2d turns pass, %4d tokens, min margin %.3f, max |logit "
                   "incremental - scratch| %g\n", FILES[f], kv_recall_kind_name(kind), pass,
                   d.n_turns, res[d.n_turns - 1].cached, min_margin, worst);
            free(res);
            kv_backend_destroy(b);
        }
        kv_dialogue_free(&d);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("usage: test_dialogue DATASETS/dialogues\n");
        return 2;
    }
    kv_recall_vocab_get(&V);
    double t0 = kv_now();
    kv_model models[2];
    kv_err e;
    for (int k = 0; k < 2; k++) {
        kv_recall_opts o;
        kv_recall_opts_default(&o, k ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT);
        if (kv_recall_build(&models[k], &o, &e)) {
            printf("build: %s\n", e.msg);
            return 1;
        }
    }
    test_parse();
    test_session(&models[1]);
    test_datasets(argv[1], models);
    kv_model_free(&models[0]);
    kv_model_free(&models[1]);
    printf("test_dialogue: %.1f s\n", kv_now() - t0);
    return kv_test_finish();
}
