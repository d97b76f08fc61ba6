/* Chapter 09: who forgets the needle? Every selection method (kv_retain.h) on the needle grid
 * and the dialogue suite, each cell and each turn asserted as predicted from the recall
 * models' construction before it was measured (chapters/09-eviction/README.md; the two
 * corrected predictions, h2o with a ratio budget and Quest without dense layers on the
 * induction model, are stated with their reasons in datasets/needle/ch09.txt).
 *
 *   test_select_needle DATASETS          the grid at 1024 tokens, the dialogues (default ctest)
 *   test_select_needle DATASETS slow     the whole of needle/ch09.txt (1024 and 4096; label slow)
 *
 * Every needle question is a forward step of its own and the haystack arrives in chunks, so
 * each method has evicted before a question is asked (eviction happens at step ends). */
#include "common/kv_test.h"
#include "common/kv_test_backend.h"
#include "common/kv_test_data.h"

#include "kv_dialogue.h"
#include "kv_needle.h"
#include "kv_quant.h"
#include "kv_retain.h"

#include <stdlib.h>
#include <string.h>

static kv_recall_vocab V;

/* ---- variant strings and rules ------------------------------------------------------------ */

static void test_variants(void)
{
    kv_cache_spec cs;
    kv_err e;
    KV_CHECK(kv_needle_cache_spec("h2o/b128/w16/int8", 1, 512, &cs, &e) == KV_OK &&
                 cs.retain.select == KV_SELECT_H2O && cs.retain.budget == 128 &&
                 cs.retain.window == 16 && cs.quant.dtype == KV_QF_INT8 && cs.capacity == 512,
             "h2o/b128/w16/int8: %s", e.msg);
    KV_CHECK(kv_needle_cache_spec("snapkv/r0.25/w8/s4", 1, 512, &cs, &e) == KV_OK &&
                 cs.retain.select == KV_SELECT_SNAPKV && cs.retain.budget == 0 &&
                 cs.retain.ratio == 0.25 && cs.retain.sinks == 4 && cs.retain.window == 8,
             "snapkv/r0.25/w8/s4: %s", e.msg);
    KV_CHECK(kv_needle_cache_spec("quest/b64/d2", 1, 512, &cs, &e) == KV_OK &&
                 cs.retain.select == KV_SELECT_QUEST && cs.retain.dense_layers == 2 &&
                 cs.quant.dtype == KV_QF_F32, "quest/b64/d2: %s", e.msg);
    KV_CHECK(kv_needle_cache_spec("l2-small/b8", 1, 512, &cs, &e) == KV_OK &&
                 cs.retain.select == KV_SELECT_L2_SMALL, "l2-small/b8: %s", e.msg);
    /* refusals name what is wrong */
    static const struct { const char *v, *word; } bad[] = {
        {"h2o/b64/x3", "x3"},         {"h2o/w16", "budget"},  {"topk/b16/r0.5", "topk/b16/r0.5"},
        {"l2-large/b8/w16", "b8/w16"}, {"snapkv/b64", "snapkv/b64"}, {"h2o/r1.5", "1.5"},
        {"quest/b64/int4", "int4"},    {"h2o/b64/int8/fp16", "fp16"}, {"h2o/bx", "bx"}};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        e.msg[0] = 0;
        const int rc = kv_needle_cache_spec(bad[i].v, 1, 512, &cs, &e);
        KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, bad[i].word), "'%s' refused naming "
                 "'%s': rc %d, '%s'", bad[i].v, bad[i].word, rc, e.msg);
    }
    /* the chapter 09 rules */
    kv_needle_variant v;
    kv_needle_result r = {0};
    KV_CHECK(kv_needle_variant_parse("x", "kept:4,16", &v, &e) == KV_OK &&
                 v.rule == KV_EXPECT_KEPT && v.arg == 4 && v.arg2 == 16, "kept:4,16");
    r.kind = KV_MODEL_RECALL_INDUCTION; /* value token at position + 1 */
    r.position = 2;
    r.distance = 900;
    KV_CHECK(kv_needle_expect(&v, &r) == 1, "induction value at 3 < 4: kept by the sinks");
    r.position = 3;
    KV_CHECK(kv_needle_expect(&v, &r) == 0, "induction value at 4: not a sink");
    r.distance = 17;
    KV_CHECK(kv_needle_expect(&v, &r) == 1, "value 16 back: in the window");
    r.kind = KV_MODEL_RECALL_DIRECT;
    r.position = 500;
    KV_CHECK(kv_needle_expect(&v, &r) == 0, "direct fact 17 back: outside");
    kv_needle_variant_parse("x", "atleast:0,16", &v, &e);
    KV_CHECK(kv_needle_expect(&v, &r) == -1, "atleast: outside the window not asserted");
    KV_CHECK(kv_needle_variant_parse("x", "page-split:16", &v, &e) == KV_OK, "page-split");
    r.kind = KV_MODEL_RECALL_INDUCTION;
    r.position = 767;
    KV_CHECK(kv_needle_expect(&v, &r) == 0, "value at 768 starts a page");
    r.kind = KV_MODEL_RECALL_DIRECT;
    KV_CHECK(kv_needle_expect(&v, &r) == 1, "a direct fact never straddles");
    KV_CHECK(kv_needle_variant_parse("x", "from:112", &v, &e) == KV_OK, "from");
    KV_CHECK(kv_needle_expect(&v, &r) == 1, "from:112: direct fact at 767");
    r.position = 1;
    KV_CHECK(kv_needle_expect(&v, &r) == 0, "from:112: direct fact at 1");
    KV_CHECK(kv_needle_variant_parse("x", "kept:4", &v, &e) == KV_ERR_ARG, "kept needs E,W");
    kv_needle_spec s;
    kv_needle_spec_default(&s);
    KV_CHECK(kv_needle_spec_parse("chunk 64\n", &s, &e) == KV_OK && s.chunk == 64, "chunk");
    KV_CHECK(kv_needle_spec_parse("chunk 0\n", &s, &e) == KV_ERR_FORMAT, "chunk 0 refused");
}

/* ---- the needle grid ---------------------------------------------------------------------- */

static void run_grid(const char *dir, int slow)
{
    kv_needle_spec s;
    kv_err e;
    if (kv_test_needle_read(dir, "needle/ch09.txt", &s)) return;
    KV_CHECK(s.chunk == 64 && s.n_variants >= 12, "ch09.txt: chunk %d, %d variants", s.chunk,
             s.n_variants);
    if (!slow) s.n_lengths = 1; /* 1024 only by default */
    const double t0 = kv_now();
    kv_needle_result *res = NULL;
    int n = 0;
    if (kv_needle_grid(&s, kv_test_make_cpu, NULL, NULL, NULL, &res, &n, &e)) {
        KV_CHECK(0, "grid: %s", e.msg);
        return;
    }
    const int per = s.n_seeds * s.n_lengths * s.n_depths;
    for (int i = 0; i < n; i++) {
        const kv_needle_result *r = &res[i];
        const char *spec = s.variants[r->variant].spec;
        int expected = r->expected;
        /* corrected prediction for Quest without dense layers (ch09.txt): the direct model
         * passes everything; on the induction model the needle whose value token starts a
         * page is lost when each head picks a single page (b16) */
        if (!strncmp(spec, "quest/", 6) && !strstr(spec, "/d")) {
            const int last = r->position + (r->kind == KV_MODEL_RECALL_INDUCTION);
            if (r->kind == KV_MODEL_RECALL_DIRECT) expected = 1;
            else if (!strcmp(spec, "quest/b16") && last % KV_SELECT_PAGE == 0) expected = 0;
        }
        if (expected >= 0)
            KV_CHECK(r->pass == expected, "%s L %d depth %d%% (%s): %s, predicted %s (margin "
                     "%.3f)", kv_recall_kind_name(r->kind), r->length, r->depth, spec,
                     r->pass ? "pass" : "fail", expected ? "pass" : "fail", r->margin);
    }
    /* one line per (model, variant): which depths keep the needle */
    printf("needle grid ch09 (%s, chunk %d): pass per depth", slow ? "1024 4096" : "1024",
           s.chunk);
    for (int d = 0; d < s.n_depths; d++) printf(" %d%%", s.depths[d]);
    printf("\n");
    for (int g = 0; g < n / per; g++) {
        const kv_needle_result *r0 = res + (size_t)g * per;
        printf("  %-9s %-20s", kv_recall_kind_name(r0->kind), s.variants[r0->variant].spec);
        for (int i = 0; i < per; i++) printf(" %s", r0[i].pass ? "+" : ".");
        printf("\n");
    }
    printf("grid: %d cells in %.1f s\n", n, kv_now() - t0);
    free(res);
}

/* Budget accounting after a needle context: an evicting method holds exactly B rows per
 * (layer, KV head), and kv_retain_bytes() counts them in the layer's format. */
static void test_bytes(const kv_model *m)
{
    static const char *const variants[] = {"l2-large/b64/w16", "h2o/b64/w16/int8", "quest/b64"};
    for (int i = 0; i < 3; i++) {
        kv_cache_spec cs;
        kv_backend *b = NULL;
        kv_err e;
        int tokens[1024];
        const int depths[] = {0, 50, 100};
        kv_needle_item items[3];
        kv_needle_result res[3];
        int rc = kv_needle_cache_spec(variants[i], 1, 1024 + 6, &cs, &e);
        if (!rc) rc = kv_backend_cpu(&b, m, &cs, &e);
        if (!rc)
            rc = kv_needle_build(KV_MODEL_RECALL_DIRECT, 1024, depths, 3, 7, tokens, items, &e);
        if (!rc) rc = kv_needle_run(b, 0, KV_MODEL_RECALL_DIRECT, tokens, 1024, items, 3, 64, res,
                                    NULL, NULL, 0, 0, &e);
        kv_select_bytes got = {0}, one = {0};
        if (!rc) rc = kv_retain_bytes(kv_backend_cpu_cache(b)->retain, &cs, 0, &got, &e);
        KV_CHECK(rc == KV_OK, "%s: %s", variants[i], e.msg);
        const int L = m->config.n_layers, d = kv_config_head_dim(&m->config);
        const int64_t rows = cs.retain.select == KV_SELECT_QUEST ? 1024 + 6 : 64; /* Quest keeps all */
        kv_select_bytes_kept(cs.quant.dtype, d, rows, &one, &e);
        KV_CHECK(!rc && got.rows == rows * L && got.total == one.total * L, "%s: %lld rows, %lld "
                 "bytes (want %lld rows, %lld bytes)", variants[i], (long long)got.rows,
                 (long long)got.total, (long long)(rows * L), (long long)(one.total * L));
        printf("bytes kept after 1030 tokens, %-18s %8lld rows x layers, %9lld bytes\n",
               variants[i], (long long)got.rows, (long long)got.total);
        kv_backend_destroy(b);
    }
}

/* ---- the dialogue suite ------------------------------------------------------------------- */

static const char *const FILES[] = {"early-facts.dlg", "interleaved.dlg", "long-filler.dlg",
                                    "dense.dlg", "shared-values.dlg", "boundaries.dlg"};
#define N_FILES 6
/* under the sanitizers (argument "quick"): the first two files only, every check on them kept;
 * the Release and emulation suites run all six */
static int n_files = N_FILES;

enum { M_L2_LARGE, M_L2_SMALL, M_H2O, M_SNAPKV, M_QUEST_DENSE, M_TOPK, N_METHODS };
static const char *const DLG_VARIANTS[N_METHODS] = {"l2-large/b64/w8", "l2-small/b64/w8",
                                                   "h2o/b64/w8", "snapkv/b64/w8",
                                                   "quest/b64/d2", "topk/b16"};
#define DLG_W 8
#define DLG_B 64

/*
 * The prediction for one question turn. "Visible": an occurrence of the fact (the token the
 * retrieval head reads: direct the fact, induction its value or a correct earlier reply,
 * which restates "k_a v_b") was kept at the end of the previous step or is in this turn.
 * Nothing is evicted while the cache holds at most B positions. For L2-small and H2O the
 * window holds the last W positions before the turn; SnapKV evicts only after steps of more
 * than W tokens, keeping that step's last W.
 *  - L2-small: a fact is lost once the small-norm positions (everything but facts, replies
 *    that restate them and BOS) older than the window number B - W: the smallest B - W norms
 *    are then all small ones. Fewer than that: its rank among the large norms decides (not
 *    asserted).
 *  - H2O: kept if among the first 16 positions (heavy from the start); lost if it arrived at
 *    position >= 2B in the middle of a step (a newcomer among frozen heavy hitters); a fact
 *    still in the window at its step's end collects the whole next step's mass first (the
 *    sibling head's 2.7x): not asserted (the correction of ch09_predictions).
 * occ_tail[i]: occurrence i was among the last W positions of its step. n_small: small-norm
 * positions before turn_start - W. Returns 1, 0 or -1 (not asserted).
 */
static int predict_turn(int method, const int *occ, const int *occ_tail, int n_occ,
                        int turn_start, int last_big_end, int n_small)
{
    if (method == M_L2_LARGE || method == M_QUEST_DENSE || method == M_TOPK) return 1;
    if (turn_start <= DLG_B) return 1; /* nothing evicted yet */
    int visible = 0, early = 0, late = n_occ > 0;
    for (int i = 0; i < n_occ; i++) {
        const int p = occ[i];
        if (method == M_SNAPKV) visible |= p >= last_big_end - DLG_W;
        else visible |= p >= turn_start - DLG_W;
        early |= p < 16;
        late &= p >= 2 * DLG_B && !occ_tail[i];
    }
    if (visible) return 1;
    if (method == M_L2_SMALL) return n_small >= DLG_B - DLG_W ? 0 : -1;
    if (method == M_H2O) return early ? 1 : late ? 0 : -1;
    return -1; /* SnapKV: older facts depend on the filler votes of every later step */
}

static void test_dialogues(const char *dir, const kv_model *models)
{
    const double t0 = kv_now();
    printf("dialogues: question turns passed / asserted / questions, per method\n%-18s %-9s",
           "dialogue", "model");
    for (int m = 0; m < N_METHODS; m++) printf(" %16s", DLG_VARIANTS[m]);
    printf("\n");
    char dlg_dir[1024];
    snprintf(dlg_dir, sizeof dlg_dir, "%s/dialogues", dir);
    for (int f = 0; f < n_files; f++) {
        kv_dialogue dl;
        kv_err e;
        if (kv_test_dialogue_read(dlg_dir, FILES[f], &dl)) continue;
        for (int k = 0; k < 2; k++) {
            const int kind = k ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT;
            const int need = kv_dialogue_length(&dl, kind);
            int *tok = malloc(sizeof(int) * (size_t)need);
            int *start = malloc(sizeof(int) * (size_t)dl.n_turns); /* [turns] first position */
            int *len = malloc(sizeof(int) * (size_t)dl.n_turns);   /* [turns] tokens */
            for (int t = 0, at = 0; t < dl.n_turns; t++) {
                kv_dialogue_render(&dl, t, kind, tok, need, &len[t], &e);
                start[t] = at;
                at += len[t] + 1; /* the turn and its reply */
            }
            printf("%-18s %-9s", FILES[f], kv_recall_kind_name(kind));
            for (int m = 0; m < N_METHODS; m++) {
                kv_cache_spec sp;
                kv_backend *b = NULL;
                kv_dlg_result *res = calloc((size_t)dl.n_turns, sizeof *res);
                int rc = kv_needle_cache_spec(DLG_VARIANTS[m], 2, need, &sp, &e);
                if (!rc) rc = kv_backend_cpu(&b, &models[k], &sp, &e);
                if (!rc) rc = kv_dialogue_run(b, &dl, kind, 0, res, &e);
                KV_CHECK(rc == KV_OK, "%s %s: %s", FILES[f], DLG_VARIANTS[m], rc ? e.msg : "");
                /* occurrences per key: positions that state the key's value */
                int occ[KV_RECALL_KEYS][32], tail[KV_RECALL_KEYS][32], n_occ[KV_RECALL_KEYS] = {0};
                char *large = calloc((size_t)need + 1, 1); /* [need] large retrieval norm */
                int questions = 0, passed = 0, asserted = 0, last_big_end = 0;
                for (int t = 0; t < dl.n_turns && !rc; t++) {
                    int n = 0;
                    kv_dialogue_render(&dl, t, kind, tok, need, &n, &e);
                    for (int i = 0; i < n; i++) {
                        int key = -1;
                        if (kind == KV_MODEL_RECALL_DIRECT && tok[i] >= V.fact0)
                            key = (tok[i] - V.fact0) / V.n_values;
                        else if (kind == KV_MODEL_RECALL_INDUCTION && i > 0 &&
                                 tok[i - 1] >= V.key0 && tok[i - 1] < V.value0 &&
                                 tok[i] >= V.value0 && tok[i] < V.query0)
                            key = tok[i - 1] - V.key0;
                        if (key >= 0 && n_occ[key] < 32) {
                            tail[key][n_occ[key]] = i >= n - DLG_W;
                            occ[key][n_occ[key]++] = start[t] + i;
                        }
                        if (key >= 0 || tok[i] == V.bos) large[start[t] + i] = 1;
                    }
                    int predicted = 1, n_small = 0;
                    for (int p = 0; p < start[t] - DLG_W; p++) n_small += !large[p];
                    const int qk = dl.turns[t].question_key;
                    if (qk >= 0) {
                        predicted = predict_turn(m, occ[qk], tail[qk], n_occ[qk], start[t],
                                                 last_big_end, n_small);
                        questions++;
                        passed += res[t].pass;
                        asserted += predicted >= 0;
                    }
                    char b1[32], b2[32];
                    if (predicted >= 0)
                        KV_CHECK(res[t].pass == predicted, "%s (%s) %s turn %d: reply %s, "
                                 "expected %s: %s, predicted %s", FILES[f],
                                 kv_recall_kind_name(kind), DLG_VARIANTS[m], t + 1,
                                 kv_recall_token_name(&V, res[t].reply, b1),
                                 kv_recall_token_name(&V, res[t].expected, b2),
                                 res[t].pass ? "kept" : "forgotten",
                                 predicted ? "kept" : "forgotten");
                    /* a correct reply restates the fact (induction: "k_a" then "v_b") */
                    if (qk >= 0 && kind == KV_MODEL_RECALL_INDUCTION && res[t].pass &&
                        n_occ[qk] < 32) {
                        large[start[t] + n] = 1;
                        tail[qk][n_occ[qk]] = 1; /* a one-token step: always its own window */
                        occ[qk][n_occ[qk]++] = start[t] + n;
                    }
                    if (n > DLG_W) last_big_end = start[t] + n; /* SnapKV compressed here */
                }
                printf("       %2d/%2d/%2d", passed, asserted, questions);
                free(large);
                free(res);
                kv_backend_destroy(b);
            }
            printf("\n");
            free(tok);
            free(start);
            free(len);
        }
        kv_dialogue_free(&dl);
    }
    printf("dialogues: %.1f s\n", kv_now() - t0);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("usage: test_select_needle DATASETS [slow|quick]\n");
        return 2;
    }
    const int slow = argc > 2 && !strcmp(argv[2], "slow");
    if (argc > 2 && !strcmp(argv[2], "quick")) n_files = 2;
    kv_recall_vocab_get(&V);
    const double t0 = kv_now();
    kv_model models[2];
    if (kv_test_recall_models(models)) return kv_test_finish();
    test_variants();
    run_grid(argv[1], slow);
    if (!slow) {
        test_bytes(&models[0]);
        test_dialogues(argv[1], models);
    }
    kv_model_free(&models[0]);
    kv_model_free(&models[1]);
    printf("test_select_needle: %.1f s\n", kv_now() - t0);
    return kv_test_finish();
}
