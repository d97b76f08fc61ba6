/*
 * Scripted conversations for a chat model's multi-turn memory (kv_chat_dialogue.h).
 *
 * Without a model (label cpu): the script format (turns, """ blocks and their line numbers,
 * facts and asks, the refusals, each naming its line), the ask's rule, and the committed
 * scripts datasets/chat-dialogues/memory-N.chat: each of at least 12 turns, its facts asked 2, 4, 8
 * and 12 turns after they are stated.
 *
 * With the real model (`real`, label realmodel, 77 and the fetch command when it is absent):
 * SmolLM2-135M-Instruct on a three-turn script with an fp32 cache. Kept across turns, the
 * conversation chooses the same reply tokens as one recomputing every turn from an empty cache
 * (the same ids at the same positions, and fp32 keeps every K/V row as computed); on a paged
 * cache with prefix caching, a second run of the script adopts the blocks of the system
 * message the first one wrote, and chooses the same tokens again (the adopted rows are those
 * rows, bit for bit).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_test.h"
#include "common/kv_test_chat_model.h"
#include "common/kv_test_model.h"
#include "kv_chat_dialogue.h"
#include "kv_gguf.h"
#include "kv_gguf_model.h"
#include "kv_needle.h"

static const char script[] =
    "# a comment\n"
    "user: My cat is named Pumpernickel. Please remember it.\n"
    "fact cat: Pumpernickel\n"
    "\n"
    "user: \"\"\"\n"
    "Summarise this:\n"
    "The river is wide.\n"
    "\"\"\"\n"
    "ask cat | What is my cat's name? | Your cat's name is\n";

static void parse_ok(void)
{
    kv_chat_script s;
    kv_err err = {{0}};
    int st = kv_chat_script_parse(script, "t", &s, &err);
    KV_CHECK(st == KV_OK, "parse: %s", err.msg);
    if (st) return;
    KV_CHECK(s.n_turns == 3 && s.n_facts == 1, "3 turns, 1 fact: %d, %d", s.n_turns, s.n_facts);
    KV_CHECK(!strcmp(s.facts[0].name, "cat") && !strcmp(s.facts[0].value, "Pumpernickel") &&
                 s.facts[0].turn == 0, "fact cat = Pumpernickel, stated by turn 0");
    KV_CHECK(!strcmp(s.turns[1].text, "Summarise this:\nThe river is wide.") &&
                 s.turns[1].line == 5 && s.turns[1].ask == -1,
             "a block's lines, joined: '%s' (line %d)", s.turns[1].text, s.turns[1].line);
    KV_CHECK(s.turns[2].ask == 0 && !strcmp(s.turns[2].text, "What is my cat's name?") &&
                 !strcmp(s.turns[2].opening, "Your cat's name is") && s.turns[2].line == 9,
             "the ask: question, opening, line 9 (line %d)", s.turns[2].line);
    kv_chat_script_free(&s);
}

static void parse_refusals(void)
{
    static const struct { const char *text, *says; } bad[] = {
        {"fact a: 1\nuser: hi\n", ":1: fact 'a' has no turn above it"},
        {"user: hi\nask b | Q? | A\n", ":2: ask of fact 'b', which no earlier line states"},
        {"user: hi\nfact a: 1\nuser: yo\nfact a: 2\n", ":4: fact 'a' is stated twice"},
        {"user: \"\"\"\nno end\n", ":1: a \"\"\" block, empty or without"},
        {"user: hi\nfact a 1\n", ":2: a fact is 'fact NAME: VALUE'"},
        {"user: hi\nfact a: 1\nask a | Q?\n", ":3: an ask is 'ask NAME | QUESTION | OPENING'"},
        {"hello\n", ":1: a line is 'user: TEXT'"},
        {"# nothing\n", "t: no turn"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kv_chat_script s;
        kv_err err = {{0}};
        const int st = kv_chat_script_parse(bad[i].text, "t", &s, &err);
        KV_CHECK(st == KV_ERR_FORMAT && strstr(err.msg, bad[i].says),
                 "refused with '%s': got %d '%s'", bad[i].says, st, err.msg);
        if (st == KV_OK) kv_chat_script_free(&s);
    }
}

static void match_rule(void)
{
    KV_CHECK(kv_cd_match(" Pumpernickel.", "Pumpernickel") && kv_cd_match("it is MANGO", "mango") &&
                 kv_cd_match(" 4721", "4721"), "the value found, case ignored");
    KV_CHECK(!kv_cd_match(" Pumper", "Pumpernickel") && !kv_cd_match("", "42") &&
                 !kv_cd_match("472 1", "4721"), "a part of the value is no match");
}

/* the committed scripts: >= 12 turns, facts asked at 2, 4, 8 and 12 turns */
static void datasets(const char *dir)
{
    for (int i = 1; i <= 6; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/memory-%d.chat", dir, i);
        kv_chat_script s;
        kv_err err = {{0}};
        const int st = kv_chat_script_read(path, &s, &err);
        KV_CHECK(st == KV_OK, "%s: %s", path, err.msg);
        if (st) continue;
        int seen = 0; /* bit d: a fact asked d turns after its statement */
        for (int t = 0; t < s.n_turns; t++)
            if (s.turns[t].ask >= 0) seen |= 1 << (t - s.facts[s.turns[t].ask].turn);
        KV_CHECK(s.n_turns >= 12 && s.n_facts == 4 &&
                     seen == ((1 << 2) | (1 << 4) | (1 << 8) | (1 << 12)),
                 "%s: %d turns, %d facts, asked at distances mask 0x%x", path, s.n_turns,
                 s.n_facts, seen);
        kv_chat_script_free(&s);
    }
}

/* ---- the real model ------------------------------------------------------------------ */

static int run(const kv_model *m, const kv_chat_template *t, const kv_vocab *v,
               const char *layout, int recompute, int times, const kv_chat_script *s,
               kv_cd_result *res /* [times][n_turns] */)
{
    kv_err err = {{0}};
    kv_cache_spec spec;
    kv_backend *b = NULL;
    kv_chat c = {0};
    int st = kv_needle_cache_spec("fp32", 1, 512, &spec, &err);
    if (!st && !strcmp(layout, "paged")) {
        spec.layout.kind = KV_LAYOUT_PAGED;
        spec.layout.block_size = 16;
        spec.layout.n_blocks = 512 / 16 * 2;
    }
    if (!st) st = kv_backend_cpu(&b, m, &spec, &err);
    if (!st && spec.layout.kind == KV_LAYOUT_PAGED) st = kv_backend_enable_prefix_cache(b, &err);
    if (!st) st = kv_chat_init(&c, b, t, v, NULL, &err);
    c.recompute = recompute;
    for (int k = 0; k < times && !st; k++)
        st = kv_chat_script_run(&c, s, 8, 6, NULL, NULL, res + (size_t)k * s->n_turns, &err);
    KV_CHECK(st == KV_OK, "%s%s: %s", layout, recompute ? ", recompute" : "", err.msg);
    kv_chat_free(&c);
    kv_backend_destroy(b);
    return st;
}

static int same_replies(const kv_cd_result *a, const kv_cd_result *b, int n)
{
    for (int t = 0; t < n; t++)
        if (a[t].n_reply != b[t].n_reply ||
            memcmp(a[t].reply, b[t].reply, (size_t)a[t].n_reply * sizeof(int)))
            return 0;
    return 1;
}

static void real_model(void)
{
    char path[4096];
    if (!kv_test_model_path(KV_TEST_SMOLLM2, "smollm2", path, sizeof path)) exit(KV_TEST_SKIP);
    kv_test_chat c;
    kv_chat_script s = {0};
    kv_err err = {{0}};
    int st = kv_test_chat_open(path, &c, &err);
    if (!st) st = kv_chat_script_parse(script, "t", &s, &err);
    KV_CHECK(st == KV_OK, "model %s: %s", path, err.msg);
    kv_cd_result inc[3], rec[3], paged[2][3];
    if (!st && !run(&c.m, &c.t, c.v, "contiguous", 0, 1, &s, inc) &&
        !run(&c.m, &c.t, c.v, "contiguous", 1, 1, &s, rec)) {
        KV_CHECK(same_replies(inc, rec, 3), "kept across turns = recomputed every turn, token "
                 "for token");
        printf("the ask (distance %d turns, %d tokens):%s -> %s\n", inc[2].distance,
               inc[2].distance_tokens, inc[2].text, inc[2].pass ? "recalled" : "missed");
    }
    if (!st && !run(&c.m, &c.t, c.v, "paged", 0, 2, &s, &paged[0][0])) {
        KV_CHECK(paged[0][0].prefix_hit == 0 && paged[1][0].prefix_hit >= 16 &&
                     paged[1][0].prefix_hit % 16 == 0,
                 "the second run adopts whole blocks of the first's opening: %d then %d tokens",
                 paged[0][0].prefix_hit, paged[1][0].prefix_hit);
        KV_CHECK(same_replies(paged[0], paged[1], 3), "adopted blocks: the same tokens");
        printf("prefix cache: the second run's first turn adopted %d of its %d tokens\n",
               paged[1][0].prefix_hit, paged[1][0].prefix_hit + paged[1][0].fed);
    }
    kv_chat_script_free(&s);
    kv_test_chat_close(&c);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "real")) {
        real_model();
    } else {
        parse_ok();
        parse_refusals();
        match_rule();
        if (argc >= 2) datasets(argv[1]);
    }
    return kv_test_finish();
}
