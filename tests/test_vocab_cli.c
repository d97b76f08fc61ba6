/*
 * kvlab tokenize on the two tiny tokenizer-only GGUF files of tests/data/vocab (written by
 * tools/vocab/make_tiny_vocab.py): the ids, the pieces, --decode's exact bytes, --special,
 * --no-bos, --file with any bytes, and every refusal with exit 2.
 *
 * The expected ids follow from the files' token lists (make_tiny_vocab.py):
 *   tiny-bpe  0..2 <|endoftext|> <|im_start|> <|im_end|>, then GPT-2's character of byte b at
 *             3 + b, then the results of its merges in rank order from 259: "Ġt" 259, "he" 260,
 *             "Ġthe" 261, ..., "en" 271, ..., "Ġworld" 278, "He" 279, "Hell" 280, "Hello" 281
 *   tiny-spm  0..2 <unk> <s> </s>, <0xXX> at 3 + XX, then "▁" 259 ... "▁the" 272 ... "▁world"
 *             279, "He" 280, "Hello" 281, "▁Hello" 282 (a longer piece scores higher)
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_test.h"
#include "common/kv_test_cli.h"

static char bpe[PATH_MAX + 16], spm[PATH_MAX + 16];

/* run kvlab tokenize with args; expect exit 0 and stdout exactly want */
static void expect_out(const char *want, const char *const *args)
{
    result r = run_in(dir, args);
    KV_CHECK(r.rc == 0 && r.out && strcmp(r.out, want) == 0,
             "kvlab %s %s ...: exit %d, stdout '%s', want '%s' (stderr: %s)", args[0], args[2], r.rc,
             r.out ? r.out : "", want, r.err ? r.err : "");
    free(r.out);
    free(r.err);
}

#define OUT(want, ...) expect_out(want, (const char *const[]){__VA_ARGS__, NULL})

/* the first line of stdout (the ids) */
static void expect_ids(const char *want, const char *const *args)
{
    result r = run_in(dir, args);
    char *nl = r.out ? strchr(r.out, '\n') : NULL;
    if (nl) *nl = '\0';
    KV_CHECK(r.rc == 0 && nl && strcmp(r.out, want) == 0, "ids '%s', want '%s' (exit %d: %s)",
             r.out ? r.out : "", want, r.rc, r.err ? r.err : "");
    free(r.out);
    free(r.err);
}

#define IDS(want, ...) expect_ids(want, (const char *const[]){__VA_ARGS__, NULL})

int main(int argc, char **argv)
{
    kv_test_cli_init(argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: %s <kvlab> <tests/data/vocab>\n", argv[0]);
        return 2;
    }
    char data[PATH_MAX]; /* absolute: kvlab runs in the scratch folder */
    if (!realpath(argv[2], data)) snprintf(data, sizeof data, "%s", argv[2]);
    snprintf(bpe, sizeof bpe, "%s/tiny-bpe.gguf", data);
    snprintf(spm, sizeof spm, "%s/tiny-spm.gguf", data);

    /* byte-level BPE, smollm's pre-tokenizer: digits one by one, a space alone before them */
    OUT("1 281 278 35 52 53 261\n"
        "     1 \"<|im_start|>\"\n"
        "   281 \"Hello\"\n"
        "   278 \" world\"\n"
        "    35 \" \"\n"
        "    52 \"1\"\n"
        "    53 \"2\"\n"
        "   261 \" the\"\n",
        "tokenize", "--model", bpe, "--special", "--text", "<|im_start|>Hello world 12 the");
    /* without --special the control token is text: "<|" "im" "_" "end" "|>", "en" merged */
    IDS("63 127 108 112 98 271 103 127 65", "tokenize", "--model", bpe, "--text", "<|im_end|>");
    /* a character split between tokens, a NUL, an invalid byte (read as U+FFFD, EF BF BD) */
    write_bytes(file("bytes.bin"), "\xC3\xA9\0\xFF", 4);
    OUT("198 172 3 242 194 192\n"
        "   198 \"\\xC3\"\n"
        "   172 \"\\xA9\"\n"
        "     3 \"\\x00\"\n"
        "   242 \"\\xEF\"\n"
        "   194 \"\\xBF\"\n"
        "   192 \"\\xBD\"\n",
        "tokenize", "--model", bpe, "--file", file("bytes.bin"));
    IDS("", "tokenize", "--model", bpe, "--text", "");
    /* --decode: the exact bytes, nothing added */
    OUT("Hello world", "tokenize", "--model", bpe, "--decode", "281 278");
    OUT("<|im_end|>\xC3\xA9\n", "tokenize", "--model", bpe, "--decode", "2,198,172,13");

    /* SentencePiece-style: BOS by default, a space in front, spaces as ▁, byte fallback */
    OUT("1 282 272 279 259 198 172\n"
        "     1 \"<s>\"\n"
        "   282 \" Hello\"\n"
        "   272 \" the\"\n"
        "   279 \" world\"\n"
        "   259 \" \"\n"
        "   198 \"\\xC3\"\n"
        "   172 \"\\xA9\"\n",
        "tokenize", "--model", spm, "--text", "Hello the world \xC3\xA9");
    IDS("282", "tokenize", "--model", spm, "--no-bos", "--text", "Hello");
    IDS("1 1 282", "tokenize", "--model", spm, "--special", "--text", "<s>Hello");
    OUT(" Hello world\n", "tokenize", "--model", spm, "--decode", "282 279 13");

    /* refusals: exit 2, a message naming the problem, nothing on stdout */
    CLI_BAD("--model|required", "tokenize", "--text", "x");
    CLI_BAD("exactly one", "tokenize", "--model", bpe);
    CLI_BAD("exactly one", "tokenize", "--model", bpe, "--text", "x", "--decode", "1");
    CLI_BAD("--decode|abc", "tokenize", "--model", bpe, "--decode", "5 abc");
    CLI_BAD("--decode|283", "tokenize", "--model", bpe, "--decode", "283");
    CLI_BAD("--decode|-1", "tokenize", "--model", bpe, "--decode", "-1");
    CLI_BAD("no-such.gguf", "tokenize", "--model", file("no-such.gguf"), "--text", "x");
    write_bytes(file("not.gguf"), "not a gguf file", 15);
    CLI_BAD("not.gguf", "tokenize", "--model", file("not.gguf"), "--text", "x");
    CLI_BAD("--file", "tokenize", "--model", bpe, "--file", file("missing.txt"));
    CLI_BAD("--bogus", "tokenize", "--model", bpe, "--bogus");
    result r = run_in(dir, (const char *const[]){"tokenize", "--help", NULL});
    KV_CHECK(r.rc == 0 && strstr(r.out, "--decode") && strstr(r.out, "--special") &&
             strstr(r.out, "--no-bos"), "tokenize --help: exit %d", r.rc);
    free(r.out);
    free(r.err);
    cleanup();
    return kv_test_finish();
}
