/*
 * kvlab chat on the real model (SmolLM2-135M-Instruct, GGUF; label realmodel: exits 77 with
 * the fetch command when the file is absent).
 *
 *  1. The template's rendering, ids against ids: a conversation rendered by kv_chat (control
 *     tokens by id, the text between them encoded with special = 0) equals
 *       - llama.cpp's ids for the same ChatML prompt (tests/data/smollm2/greedy-chat.txt's
 *         prompt_ids: the model's system line, one user message, the reply's header, tokenized
 *         by llama.cpp with special parsing on), as kv_chat_render_prompt() (the one-turn
 *         prompt of kvlab spec --script and kvlab serve) renders it too, and
 *       - the string the template writes, tokenized with special tokens parsed, for a second
 *         conversation and a turn after a reply cut short. The string is written here by hand
 *         from the file's Jinja text (a loop of '<|im_start|>' + role + '\n' + content +
 *         '<|im_end|>' + '\n', SmolLM2's default system message first, then
 *         '<|im_start|>assistant\n'), not made by kvlab.
 *     A user's "<|im_end|>" stays text: the only <|im_end|> ids are the template's.
 *  2. Incremental chat = recomputing the conversation every turn: a 3-turn script run by
 *     `kvlab chat` twice, keeping the cache and with --recompute, gives the same reply ids on
 *     an fp32 cache (the same ids at the same positions, and the CPU forward pass gives every
 *     row the bits of a one-token step, docs/design.md §8), while the first reuses the cache
 *     (turns 2 and 3 feed only their own tokens) and the second reuses nothing.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_test.h"
#include "common/kv_test_cli.h"
#include "kv_chat.h"
#include "kv_gguf.h"
#include "kv_vocab.h"

#define MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

static char model_path[4096];
static const char *llama_chat; /* tests/data/smollm2/greedy-chat.txt */

/* llama.cpp's prompt_ids of the ChatML prompt in @p path, into ids [cap]; -1 when unreadable */
static int llama_prompt_ids(const char *path, int *ids, int cap)
{
    FILE *f = fopen(path, "r");
    char line[8192];
    int n = -1;
    while (f && n < 0 && fgets(line, sizeof line, f)) {
        if (strncmp(line, "prompt_ids ", 11)) continue;
        char *p = line + 11, *end;
        const long count = strtol(p, &end, 10);
        for (n = 0; n < count && n < cap; n++) {
            p = end;
            ids[n] = (int)strtol(p, &end, 10);
            if (end == p) break;
        }
        if (n != count) n = -1;
    }
    if (f) fclose(f);
    return n;
}

static int find_model(void)
{
    const char *d = getenv("KVLAB_MODELS"), *home = getenv("HOME");
    if (d && d[0]) snprintf(model_path, sizeof model_path, "%s/%s", d, MODEL_FILE);
    else snprintf(model_path, sizeof model_path, "%s/.cache/kvlab/models/%s", home ? home : ".",
                  MODEL_FILE);
    FILE *f = fopen(model_path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* the ids of @p s with special tokens parsed (what llama.cpp does to a rendered prompt) */
static int encode_special(const kv_vocab *v, const char *s, int *ids, int cap)
{
    int n = 0;
    kv_err err = {{0}};
    const int st = kv_vocab_encode(v, s, strlen(s), 0, 1, ids, cap, &n, &err);
    KV_CHECK(st == KV_OK, "encode '%.40s...': %s", s, err.msg);
    return st ? -1 : n;
}

static void check_same(const char *what, const int *got, int n_got, const int *want, int n_want)
{
    int same = n_got == n_want;
    for (int i = 0; same && i < n_got; i++) same = got[i] == want[i];
    KV_CHECK(same, "%s: %d ids rendered, %d expected", what, n_got, n_want);
    if (!same)
        for (int i = 0; i < n_got || i < n_want; i++)
            printf("  %3d: %6d %6d\n", i, i < n_got ? got[i] : -1, i < n_want ? want[i] : -1);
}

/* a conversation's first turn: the default system message, @p user, the reply's header */
static int render_first(const kv_chat_template *t, const kv_vocab *v, const char *user, int *ids,
                        int cap)
{
    int n = 0;
    kv_err err = {{0}};
    int st = kv_chat_render_message(t, v, 1, "system", t->default_system,
                                    strlen(t->default_system), ids, cap, &n, &err);
    if (!st) st = kv_chat_render_message(t, v, 0, "user", user, strlen(user), ids, cap, &n, &err);
    if (!st) st = kv_chat_render_reply_start(t, v, ids, cap, &n, &err);
    KV_CHECK(st == KV_OK, "render '%s': %s", user, err.msg);
    return n;
}

static void check_template(void)
{
    kv_gguf *g = NULL;
    kv_vocab *v = NULL;
    kv_err err = {{0}};
    kv_gguf_str tpl = {0};
    int st = kv_gguf_open(model_path, &g, &err);
    if (!st) st = kv_vocab_from_gguf(g, &v, &err);
    if (!st) st = kv_gguf_get_str(g, "tokenizer.chat_template", &tpl, &err);
    KV_CHECK(st == KV_OK, "open %s: %s", model_path, err.msg);
    kv_chat_template t;
    if (!st) st = kv_chat_template_parse(tpl.s, tpl.n, v, &t, &err);
    KV_CHECK(st == KV_OK, "template: %s", err.msg);
    if (st) goto done;
    KV_CHECK(t.format == KV_CHAT_CHATML && t.msg_start == 1 && t.msg_end == 2,
             "ChatML with <|im_start|> 1, <|im_end|> 2: got %s, %d, %d",
             kv_chat_format_name(t.format), t.msg_start, t.msg_end);

    enum { CAP = 512 };
    int got[CAP], want[CAP], n = 0;
    /* llama.cpp's ids for its ChatML prompt */
    const char *sky = "Explain in a few sentences why the sky is blue.";
    n = render_first(&t, v, sky, got, CAP);
    const int m0 = llama_prompt_ids(llama_chat, want, CAP);
    KV_CHECK(m0 == 41, "%s: prompt_ids of 41 ids expected, read %d", llama_chat, m0);
    check_same("llama.cpp's ChatML prompt", got, n, want, m0);
    /* the one-turn prompt of kvlab spec --script and kvlab serve's text traces: the same ids */
    int n1 = 0;
    st = kv_chat_render_prompt(&t, v, NULL, sky, strlen(sky), got, CAP, &n1, &err);
    KV_CHECK(st == KV_OK, "kv_chat_render_prompt: %s", err.msg);
    if (!st) check_same("kv_chat_render_prompt, llama.cpp's ChatML prompt", got, n1, want, m0);
    n = render_first(&t, v, "What is the capital of France?", got, CAP);
    const char *first =
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n";
    check_same("turn 1", got, n, want, encode_special(v, first, want, CAP));

    /* turn 2 after a reply cut short ("The capital", as sampled ids, without <|im_end|>):
     * the template closes the message, then the next user message and the reply's header */
    int m = encode_special(v, first, want, CAP), k = 0;
    st = kv_vocab_encode(v, "The capital", 11, 0, 0, got + n, CAP - n, &k, &err);
    memcpy(want + m, got + n, (size_t)k * sizeof(int));
    n += k, m += k;
    const char *user2 = "And of Spain?";
    if (!st) st = kv_chat_render_reply_end(&t, v, 0, got, CAP, &n, &err);
    if (!st) st = kv_chat_render_message(&t, v, 0, "user", user2, strlen(user2), got, CAP, &n, &err);
    if (!st) st = kv_chat_render_reply_start(&t, v, got, CAP, &n, &err);
    KV_CHECK(st == KV_OK, "render turn 2: %s", err.msg);
    m += encode_special(v, "<|im_end|>\n<|im_start|>user\nAnd of Spain?<|im_end|>\n"
                        "<|im_start|>assistant\n", want + m, CAP - m);
    check_same("turn 2", got, n, want, m);

    /* "<|im_end|>" typed by a user is text: <|im_start|>, the line "user\n..." encoded as
     * plain text, then the template's one <|im_end|> and "\n" */
    const char *typed = "Stop <|im_end|> here";
    n = 0;
    st = kv_chat_render_message(&t, v, 0, "user", typed, strlen(typed), got, CAP, &n, &err);
    KV_CHECK(st == KV_OK, "render typed: %s", err.msg);
    m = 0;
    want[m++] = 1;
    st = kv_vocab_encode(v, "user\nStop <|im_end|> here", 25, 0, 0, want + m, CAP - m, &k, &err);
    m += k;
    want[m++] = 2;
    st = kv_vocab_encode(v, "\n", 1, 0, 0, want + m, CAP - m, &k, &err);
    m += k;
    check_same("a typed <|im_end|>", got, n, want, m);
    int ends = 0;
    for (int i = 0; i < n; i++) ends += got[i] == t.msg_end;
    KV_CHECK(ends == 1, "a typed <|im_end|>: %d <|im_end|> ids, expected the template's one", ends);
done:
    kv_vocab_free(v);
    kv_gguf_close(g);
}

/* the "ids:" lines of a chat transcript, joined */
static char *ids_lines(const char *out)
{
    char *s = calloc(strlen(out) + 1, 1);
    for (const char *p = out; p && *p; p = strchr(p, '\n'), p += !!p)
        if (!strncmp(p, "ids:", 4)) strncat(s, p, (size_t)(strchrnul(p, '\n') - p + 1));
    return s;
}

/* the "reused" count of each turn's stats line, into r [3] */
static int reused(const char *err, int r[3])
{
    int n = 0;
    for (const char *p = err; (p = strstr(p, "[turn ")) && n < 3; p++) {
        int turn, used;
        if (sscanf(p, "[turn %d: %d tokens reused", &turn, &used) == 2) r[n++] = used;
    }
    return n;
}

static void check_incremental(void)
{
    const char *script = file("three.chat");
    const char text[] = "# three turns\nWhat is the capital of France?\n\"\"\"\nAnd of Italy?\n"
                        "One word.\n\"\"\"\nThank you.\n";
    write_bytes(script, text, sizeof text - 1);
    const char *base[] = {"chat", "--model", model_path, "--script", script, "--max-tokens", "16",
                          "--ids", "--cache", "fp32", NULL, NULL};
    result keep = run_in(dir, base);
    base[10] = "--recompute";
    result again = run_in(dir, base);
    KV_CHECK(keep.rc == 0 && again.rc == 0, "kvlab chat: exit %d and %d (%s / %s)", keep.rc,
             again.rc, keep.err, again.err);
    char *a = ids_lines(keep.out), *b = ids_lines(again.out);
    int lines = 0;
    for (const char *p = a; (p = strstr(p, "ids:")); p++) lines++;
    KV_CHECK(lines == 3, "three replies with ids, got %d:\n%s", lines, keep.out);
    KV_CHECK(strcmp(a, b) == 0, "kept cache and recompute differ:\n%s---\n%s", a, b);
    KV_CHECK(strcmp(keep.out, again.out) == 0, "transcripts differ:\n%s---\n%s", keep.out,
             again.out);
    int rk[3] = {0}, ra[3] = {0};
    KV_CHECK(reused(keep.err, rk) == 3 && reused(again.err, ra) == 3, "three stats lines each");
    KV_CHECK(rk[0] == 0 && rk[1] > 0 && rk[2] > rk[1], "kept cache reuses %d, %d, %d tokens",
             rk[0], rk[1], rk[2]);
    KV_CHECK(ra[0] == 0 && ra[1] == 0 && ra[2] == 0, "recompute reuses %d, %d, %d tokens", ra[0],
             ra[1], ra[2]);
    printf("%s%s", keep.out, keep.err);
    free(a);
    free(b);
    free(keep.out), free(keep.err), free(again.out), free(again.err);
}

int main(int argc, char **argv)
{
    if (!find_model()) {
        printf("skipped: %s is not here; fetch it with `tools/fetch-model.sh smollm2` (or set "
               "KVLAB_MODELS to its folder)\n", model_path);
        return KV_TEST_SKIP;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: %s <kvlab> <tests/data/smollm2/greedy-chat.txt>\n", argv[0]);
        return 2;
    }
    llama_chat = argv[2];
    kv_test_cli_init(argc, argv);
    check_template();
    check_incremental();
    cleanup();
    return kv_test_finish();
}
