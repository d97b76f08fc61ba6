/*
 * kvlab tokenize: a GGUF file's tokenizer (kv_vocab.h) on a text, or back.
 *
 *   kvlab tokenize --model smollm2 --text "Hello world"
 *   19556 905                      the ids, space-separated, on one line
 *   19556 "Hello"                  then each id with its piece, escaped
 *     905 " world"
 *   kvlab tokenize --model smollm2 --decode "19556 905"
 *   Hello world                    the exact bytes, nothing added
 *
 * A piece is written with its printable ASCII as is, \" \\ \n \r \t escaped, complete UTF-8
 * characters as they are, and every other byte (a character byte-level BPE split between two
 * tokens, a control byte) as \xHH, so that one line is one piece.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_file.h"
#include "kv_gguf.h"
#include "kv_unicode.h"
#include "kv_vocab.h"

#define CMD "kvlab tokenize"
#define MAX_TEXT (16 << 20) /* bytes of --file */

/* a well-formed UTF-8 character at s (no overlong form, no surrogate): 1 and its length */
static int whole_char(const char *s, int n, int *used)
{
    unsigned char again[4];
    uint32_t c = kv_utf8_read((const unsigned char *)s, (size_t)n, used);
    return *used > 1 && !(c >= 0xD800 && c <= 0xDFFF) && kv_utf8_write(c, again) == *used;
}

static void print_piece(const char *s, int n)
{
    putchar('"');
    for (int i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int used;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') printf("\\n");
        else if (c == '\r') printf("\\r");
        else if (c == '\t') printf("\\t");
        else if (c >= 0x20 && c < 0x7F) putchar(c);
        else if (c >= 0x80 && whole_char(s + i, n - i, &used)) {
            fwrite(s + i, 1, (size_t)used, stdout); /* a whole character */
            i += used;
            continue;
        } else printf("\\x%02X", c);
        i++;
    }
    putchar('"');
}

/* the bytes of --file (any bytes, up to MAX_TEXT) */
static int read_bytes(const char *path, char **text, size_t *n, kv_err *err)
{
    FILE *f;
    int64_t size;
    int rc = kv_file_open_read(path, MAX_TEXT, &f, &size, err);
    if (rc) return rc;
    *text = malloc((size_t)size + 1);
    if (!*text) {
        fclose(f);
        return kv_fail(err, KV_ERR_NOMEM, "%s: %lld bytes", path, (long long)size);
    }
    *n = fread(*text, 1, (size_t)size, f);
    int bad = ferror(f) || *n != (size_t)size;
    fclose(f);
    if (bad) return kv_fail(err, KV_ERR_IO, "%s: read failed", path);
    return KV_OK;
}

/* --decode: ids separated by spaces or commas, each inside the vocabulary */
static int decode(const kv_vocab *v, const char *list)
{
    size_t cap = 4096, at = 0;
    char *out = malloc(cap);
    int rc = out ? KV_EXIT_OK : KV_EXIT_FAIL;
    for (const char *p = list; rc == KV_EXIT_OK && *p;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        size_t len = strcspn(p, " ,\t\n");
        char word[32];
        int64_t id;
        const char *why = "not a whole number";
        if (len >= sizeof word) {
            rc = kv_args_bad(CMD, "--decode", "'%.*s...': not a token id", 20, p);
            break;
        }
        memcpy(word, p, len);
        word[len] = '\0';
        if (kv_parse_i64(word, 0, kv_vocab_size(v) - 1, &id, &why)) {
            rc = kv_args_bad(CMD, "--decode", "'%s': %s (ids are 0..%d)", word, why,
                             kv_vocab_size(v) - 1);
            break;
        }
        int n = kv_vocab_piece(v, (int)id, NULL, 0);
        if (at + (size_t)n > cap) {
            char *grown = realloc(out, 2 * (at + (size_t)n));
            if (!grown) {
                rc = KV_EXIT_FAIL;
                break;
            }
            out = grown, cap = 2 * (at + (size_t)n);
        }
        at += (size_t)kv_vocab_piece(v, (int)id, out + at, (int)(cap - at));
        p += len;
    }
    if (rc == KV_EXIT_OK) fwrite(out, 1, at, stdout); /* nothing printed on a bad id */
    free(out);
    return rc;
}

/* ids, then a line per id with its piece */
static int encode(const kv_vocab *v, const char *text, size_t len, int bos, int special)
{
    kv_err err;
    int n = 0, cap = (int)(len < (size_t)1 << 24 ? len : (size_t)1 << 24) + 8;
    int *ids = malloc((size_t)cap * sizeof *ids);
    int rc = ids ? kv_vocab_encode(v, text, len, bos, special, ids, cap, &n, &err)
                 : kv_fail(&err, KV_ERR_NOMEM, "the ids");
    if (rc == KV_ERR_CAPACITY) { /* invalid UTF-8 can give more ids than bytes: the count told */
        free(ids);
        cap = n;
        ids = malloc((size_t)cap * sizeof *ids);
        rc = ids ? kv_vocab_encode(v, text, len, bos, special, ids, cap, &n, &err)
                 : kv_fail(&err, KV_ERR_NOMEM, "the ids");
    }
    if (rc) {
        free(ids);
        return kv_cli_fail(CMD, "encode", rc, &err);
    }
    for (int i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
    putchar('\n');
    char small[256];
    for (int i = 0; i < n; i++) {
        int k = kv_vocab_piece(v, ids[i], small, sizeof small);
        char *piece = k <= (int)sizeof small ? small : malloc((size_t)k);
        if (piece != small && piece) kv_vocab_piece(v, ids[i], piece, k);
        printf("%6d ", ids[i]);
        print_piece(piece ? piece : "", piece ? k : 0);
        putchar('\n');
        if (piece != small) free(piece);
    }
    free(ids);
    return KV_EXIT_OK;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *file = NULL, *ids = NULL;
    int special = 0, no_bos = 0;
    kv_opt opts[] = {
        {"--model", KV_OPT_STRING, &model, 0, 0, NULL, "FILE", "a GGUF file, or a fetched model's name (smollm2)", 0},
        {"--text", KV_OPT_TEXT, &text, 0, 0, NULL, "STR", "the text to encode", 0},
        {"--file", KV_OPT_STRING, &file, 0, 0, NULL, "FILE", "encode this file's bytes instead", 0},
        {"--decode", KV_OPT_TEXT, &ids, 0, 0, NULL, "IDS", "print the bytes of these ids (spaces or commas between)", 0},
        {"--special", KV_OPT_FLAG, &special, 0, 0, NULL, NULL, "match control tokens (<|im_start|> ...) in the text", 0},
        {"--no-bos", KV_OPT_FLAG, &no_bos, 0, 0, NULL, NULL, "no BOS/EOS even where the tokenizer adds them", 0},
    };
    int r = kv_args_parse(CMD,
                          "Encode a text with a GGUF file's tokenizer: the ids on one line, then\n"
                          "each id with its piece (escaped). --decode prints the exact bytes of\n"
                          "a list of ids. The ids are llama.cpp's for the same file.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (!model) return kv_args_bad(CMD, "--model", "is required");
    if (!!text + !!file + !!ids != 1)
        return kv_args_bad(CMD, "--text", "give exactly one of --text, --file and --decode");

    kv_err err;
    char path[KV_CLI_PATH_MAX];
    int rc = kv_cli_model_resolve(model, path, sizeof path, &err);
    if (rc) return kv_cli_fail(CMD, "--model", rc, &err);
    kv_gguf *g = NULL;
    kv_vocab *v = NULL;
    rc = kv_gguf_open(path, &g, &err);
    if (!rc) rc = kv_vocab_from_gguf(g, &v, &err);
    kv_gguf_close(g); /* the vocabulary keeps its own copy */
    if (rc) return kv_cli_fail(CMD, path, rc, &err);

    char *bytes = NULL;
    size_t len = text ? strlen(text) : 0;
    if (file && (rc = read_bytes(file, &bytes, &len, &err))) {
        kv_vocab_free(v);
        return kv_cli_fail(CMD, "--file", rc, &err);
    }
    int exit_code = ids ? decode(v, ids) : encode(v, file ? bytes : text, len, !no_bos, special);
    free(bytes);
    kv_vocab_free(v);
    return exit_code;
}
