/* Multi-turn consistency (issue 4): the dialogue format, rendering, and every dialogue in
 * datasets/dialogues on both recall models with an exact cache: each reply is the expected one
 * (the value for a question, "ok" otherwise) and equals a from-scratch recompute of the whole
 * history (identical token; logits compared too). Chapter 05: two dialogues again on paged
 * caches (fp32 with the from-scratch check, which resets and refills a slot every turn, and
 * int8), each turn equal bit for bit to the same run on a contiguous cache.
 *
 *   test_dialogue DATASETS/dialogues  */
#include "common/kv_test.h"
#include "common/kv_test_data.h"

#include "kv_dialogue.h"
#include "kv_needle.h"

#include <string.h>

static kv_recall_vocab V;

static const char *const FILES[] = {"early-facts.dlg", "interleaved.dlg", "long-filler.dlg",
                                    "dense.dlg", "shared-values.dlg", "boundaries.dlg"};
#define N_FILES 6
/* under the sanitizers (argument "quick"): the first two files only, every check on them kept;
 * the Release and emulation suites run all six */
static int n_files = N_FILES;

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
    for (int f = 0; f < n_files; f++) {
        kv_dialogue d;
        kv_err e;
        if (kv_test_dialogue_read(dir, FILES[f], &d)) continue;
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

/* One dialogue on a cache variant, contiguous or paged with blocks of B (0: contiguous). */
static int run_variant(const kv_model *m, const kv_dialogue *d, int kind, const char *variant,
                       int B, int recompute, kv_dlg_result *res, kv_err *e)
{
    kv_cache_spec sp;
    kv_backend *b;
    int rc = kv_needle_cache_spec(variant, 2, kv_dialogue_length(d, kind), &sp, e);
    if (!rc && B) {
        sp.layout.kind = KV_LAYOUT_PAGED;
        sp.layout.block_size = B;
        sp.layout.n_blocks = sp.n_slots * ((sp.capacity + B - 1) / B);
    }
    if (!rc) rc = kv_backend_cpu(&b, m, &sp, e);
    if (rc) return rc;
    rc = kv_dialogue_run(b, d, kind, recompute, res, e);
    kv_backend_destroy(b);
    return rc;
}

static void test_paged(const char *dir, kv_model *models)
{
    static const char *const files[] = {"boundaries.dlg", "early-facts.dlg"};
    static const struct { const char *variant; int B, recompute; } runs[] = {{"fp32", 16, 1},
                                                                             {"int8", 8, 0}};
    const double t0 = kv_now();
    for (int f = 0; f < 2; f++) {
        kv_dialogue d;
        kv_err e;
        if (kv_test_dialogue_read(dir, files[f], &d)) continue;
        kv_dlg_result *ref = calloc(d.n_turns, sizeof *ref), *res = calloc(d.n_turns, sizeof *res);
        for (int k = 0; k < 2; k++)
            for (int v = 0; v < 2; v++) {
                const int kind = k ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT;
                int rc = run_variant(&models[k], &d, kind, runs[v].variant, 0, 0, ref, &e);
                if (!rc)
                    rc = run_variant(&models[k], &d, kind, runs[v].variant, runs[v].B,
                                     runs[v].recompute, res, &e);
                KV_CHECK(rc == KV_OK, "%s paged %s: %s", files[f], runs[v].variant, e.msg);
                int pass = 0, same = 0;
                for (int t = 0; t < d.n_turns && !rc; t++) {
                    pass += res[t].pass;
                    same += res[t].reply == ref[t].reply && res[t].cached == ref[t].cached &&
                            !memcmp(&res[t].margin, &ref[t].margin, sizeof(float));
                    if (runs[v].recompute)
                        KV_CHECK(res[t].recomputed && res[t].recompute_token == res[t].reply,
                                 "%s paged turn %d: incremental %d vs from scratch %d", files[f],
                                 t + 1, res[t].reply, res[t].recompute_token);
                }
                KV_CHECK(pass == d.n_turns && same == d.n_turns, "%s (%s) paged %s B=%d: %d of "
                         "%d turns pass, %d identical to contiguous", files[f],
                         kv_recall_kind_name(kind), runs[v].variant, runs[v].B, pass, d.n_turns,
                         same);
                printf("%-18s %-9s paged %-4s B=%-2d %2d/%2d turns pass, %2d identical to "
                       "contiguous\n", files[f], kv_recall_kind_name(kind), runs[v].variant,
                       runs[v].B, pass, d.n_turns, same);
            }
        free(ref);
        free(res);
        kv_dialogue_free(&d);
    }
    printf("paged dialogues: %.1f s\n", kv_now() - t0);
}

/* Chapter 06: dialogues through a sliding-window cache (induction model). Predicted before
 * measured, per question turn: the answer comes back iff the fact's latest value token is
 * still retained when the question is asked (at most W tokens back, or among the S sinks);
 * a correct answer restates the fact ("k_a" then the reply "v_b" is the fact's own pattern),
 * so it renews it. Every other turn replies "ok" as with an exact cache. The report names, per dialogue and W, the
 * first turn at which an early fact is forgotten. The W = 64 runs are also recomputed from
 * scratch through the same window after every turn: the same reply (the window keeps the
 * same rows either way). */
static void test_window_dialogues(const char *dir, const kv_model *m)
{
    static const int Ws[] = {32, 64, 128, 512};
    const int kind = KV_MODEL_RECALL_INDUCTION;
    printf("window dialogues (induction model): first turn whose question finds its fact "
           "forgotten\n%-18s %-14s", "dialogue", "positions");
    for (int w = 0; w < 4; w++) printf("   W=%-4d", Ws[w]);
    printf("\n");
    for (int f = 0; f < n_files; f++) {
        kv_dialogue d;
        kv_err e;
        if (kv_test_dialogue_read(dir, FILES[f], &d)) continue;
        const int need = kv_dialogue_length(&d, kind);
        int *tok = malloc(sizeof(int) * (size_t)need), *q_pos = malloc(sizeof(int) * d.n_turns);
        /* positions: the value token of every fact stated (in order, with its turn), the
         * question token of every question */
        int *fact_key = malloc(sizeof(int) * (size_t)need), *fact_at = malloc(sizeof(int) * (size_t)need);
        int *fact_turn = malloc(sizeof(int) * (size_t)need), n_facts = 0;
        for (int t = 0, at = 0; t < d.n_turns; t++) {
            int n = 0;
            kv_dialogue_render(&d, t, kind, tok, need, &n, &e);
            for (int i = 0; i + 1 < n; i++) /* "k_a v_b" inside a turn is a fact */
                if (tok[i] >= V.key0 && tok[i] < V.value0 && tok[i + 1] >= V.value0 &&
                    tok[i + 1] < V.query0) {
                    fact_key[n_facts] = tok[i] - V.key0;
                    fact_turn[n_facts] = t;
                    fact_at[n_facts++] = at + i + 1;
                }
            q_pos[t] = d.turns[t].question_key >= 0 ? at + n - 1 : -1;
            at += n + 1; /* the turn and its reply */
        }
        for (int sc = 0; sc < 2; sc++) {
            const int scheme = sc ? KV_POS_CACHE : KV_POS_ORIGINAL, S = sc ? 4 : 0;
            printf("%-18s %-8s S %d  ", FILES[f], kv_window_scheme_name(scheme), S);
            for (int w = 0; w < 4; w++) {
                const int W = Ws[w];
                kv_cache_spec sp = kv_cache_spec_default(2, need);
                sp.quant.dtype = w % 2 ? KV_QF_INT8 : KV_QF_F16;
                sp.window.size = W;
                sp.window.n_sinks = S;
                sp.window.pos_scheme = scheme;
                if (w >= 2) { /* paged for the larger windows */
                    sp.layout.kind = KV_LAYOUT_PAGED;
                    sp.layout.block_size = 16;
                    sp.layout.n_blocks = 2 * ((W + S + 15) / 16);
                }
                kv_backend *b = NULL;
                kv_dlg_result *res = calloc(d.n_turns, sizeof *res);
                const int recompute = w == 1; /* from scratch too (costly), on one window */
                int rc = kv_backend_cpu(&b, m, &sp, &e);
                if (!rc) rc = kv_dialogue_run(b, &d, kind, recompute, res, &e);
                KV_CHECK(rc == KV_OK, "%s W %d: %s", FILES[f], W, e.msg);
                /* every position that states a key's value: its fact, then correct replies */
                int first_lost = 0, occ[KV_RECALL_KEYS][32], n_occ[KV_RECALL_KEYS] = {0}, fi = 0;
                for (int t = 0; t < d.n_turns && !rc; t++) {
                    const kv_dlg_result *r = &res[t];
                    int predicted = 1;
                    for (; fi < n_facts && fact_turn[fi] == t; fi++)
                        if (n_occ[fact_key[fi]] < 32)
                            occ[fact_key[fi]][n_occ[fact_key[fi]]++] = fact_at[fi];
                    if (q_pos[t] >= 0) {
                        const int key = d.turns[t].question_key;
                        predicted = 0;
                        for (int i = 0; i < n_occ[key]; i++)
                            predicted |= kv_window_visible(W, S, q_pos[t], occ[key][i]);
                        if (!predicted && !first_lost) first_lost = t + 1;
                        if (predicted && n_occ[key] < 32) /* the reply restates it */
                            occ[key][n_occ[key]++] = q_pos[t] + 1;
                    }
                    char b1[32], b2[32];
                    KV_CHECK(r->pass == predicted, "%s %s W %d turn %d: reply %s, expected %s: "
                             "%s, predicted %s", FILES[f], kv_window_scheme_name(scheme), W,
                             t + 1, kv_recall_token_name(&V, r->reply, b1),
                             kv_recall_token_name(&V, r->expected, b2),
                             r->pass ? "kept" : "forgotten", predicted ? "kept" : "forgotten");
                    KV_CHECK(!recompute || (r->recomputed && r->recompute_token == r->reply),
                             "%s W %d turn %d: incremental %d vs from scratch %d", FILES[f], W,
                             t + 1, r->reply, r->recompute_token);
                }
                if (first_lost) printf("  turn %-3d", first_lost);
                else printf("  %-8s", "-");
                free(res);
                kv_backend_destroy(b);
            }
            printf("\n");
        }
        free(tok);
        free(q_pos);
        free(fact_key);
        free(fact_at);
        free(fact_turn);
        kv_dialogue_free(&d);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("usage: test_dialogue DATASETS/dialogues [quick]\n");
        return 2;
    }
    if (argc > 2 && !strcmp(argv[2], "quick")) n_files = 2;
    kv_recall_vocab_get(&V);
    double t0 = kv_now();
    kv_model models[2];
    if (kv_test_recall_models(models)) return kv_test_finish();
    test_parse();
    test_session(&models[1]);
    test_datasets(argv[1], models);
    test_paged(argv[1], models);
    test_window_dialogues(argv[1], &models[1]);
    kv_model_free(&models[0]);
    kv_model_free(&models[1]);
    printf("test_dialogue: %.1f s\n", kv_now() - t0);
    return kv_test_finish();
}
