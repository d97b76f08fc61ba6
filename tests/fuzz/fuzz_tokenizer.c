/*
 * Fuzz target: tokenizer.bin files (kv_tokenizer_read), then encode/decode with what loaded.
 *
 * Input layout: 2 bytes -> vocab_size = 1 + (u16 % 1024) (the file does not store it; the
 * model does), 1 byte -> prompt length P, P bytes of prompt text, the rest is the file.
 * A refused file must come back as KV_ERR_FORMAT with a message and a zeroed tokenizer. A
 * loaded one must keep its invariants, survive a write/read round trip unchanged, encode
 * the prompt into ids inside the vocabulary (or refuse cleanly when it lacks byte tokens)
 * and decode every id without reading outside its tokens.
 */
#include "fuzz_common.h"
#include "kv_tokenizer.h"

static void check_same(const kv_tokenizer *a, const kv_tokenizer *b)
{
    FUZZ_REQUIRE(a->vocab_size == b->vocab_size && a->max_token_length == b->max_token_length &&
                     a->byte_base == b->byte_base,
                 "round trip changed the header");
    for (int i = 0; i < a->vocab_size; i++)
        FUZZ_REQUIRE(a->lengths[i] == b->lengths[i] && a->scores[i] == b->scores[i] &&
                         memcmp(a->vocab[i], b->vocab[i], (size_t)a->lengths[i]) == 0,
                     "round trip changed token %d", i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    const int vocab = 1 + (int)((data[0] | (unsigned)data[1] << 8) % 1024);
    size_t plen = data[2];
    if (plen > size - 3) plen = size - 3;
    char *prompt = fuzz_text(data + 3, plen); /* stops at the first NUL, as a C string does */
    const uint8_t *file = data + 3 + plen;
    const size_t file_size = size - 3 - plen;

    char path[256], again[256];
    fuzz_path("tok", path, sizeof path);
    fuzz_path("tok2", again, sizeof again);
    fuzz_write(path, file, file_size);

    kv_tokenizer t;
    kv_err err = {{0}};
    int rc = kv_tokenizer_read(path, vocab, &t, &err);
    remove(path);
    if (rc != KV_OK) {
        FUZZ_REQUIRE(rc == KV_ERR_FORMAT, "unexpected status %d (%s)", rc, err.msg);
        FUZZ_REQUIRE(err.msg[0] != '\0', "status %d without a message", rc);
        FUZZ_REQUIRE(t.vocab == NULL && t.vocab_size == 0, "refused file left a tokenizer behind");
        free(prompt);
        return 0;
    }
    FUZZ_REQUIRE(t.vocab_size == vocab, "vocab_size %d, asked for %d", t.vocab_size, vocab);
    for (int i = 0; i < vocab; i++)
        FUZZ_REQUIRE(t.lengths[i] >= 0 && t.lengths[i] <= t.max_token_length &&
                         t.vocab[i][t.lengths[i]] == '\0',
                     "token %d breaks the length invariant", i);
    FUZZ_REQUIRE(t.byte_base == -1 || (t.byte_base >= 0 && t.byte_base + 256 <= vocab),
                 "byte_base %d outside the vocabulary", t.byte_base);

    FUZZ_REQUIRE(kv_tokenizer_write(again, &t, &err) == KV_OK, "write: %s", err.msg);
    kv_tokenizer t2;
    FUZZ_REQUIRE(kv_tokenizer_read(again, vocab, &t2, &err) == KV_OK, "re-read: %s", err.msg);
    remove(again);
    check_same(&t, &t2);
    kv_tokenizer_free(&t2);

    const size_t n_text = strlen(prompt);
    int *ids = malloc(sizeof(int) * (n_text + 3)); /* [strlen + 3] as encode asks */
    FUZZ_REQUIRE(ids != NULL, "out of memory");
    int n = -1;
    rc = kv_tokenizer_encode(&t, prompt, vocab > 2, vocab > 2, ids, &n, &err);
    if (rc == KV_OK) {
        FUZZ_REQUIRE(n >= 0 && (size_t)n <= n_text + 3, "encode gave %d ids for %zu bytes", n, n_text);
        char bytes[2];
        int prev = 1;
        for (int i = 0; i < n; i++) {
            FUZZ_REQUIRE(ids[i] >= 0 && ids[i] < vocab, "id %d outside the vocabulary", ids[i]);
            const char *piece = kv_tokenizer_decode(&t, prev, ids[i], bytes);
            FUZZ_REQUIRE(piece != NULL, "decode returned NULL");
            (void)strlen(piece); /* must be a readable C string */
            prev = ids[i];
        }
    } else {
        FUZZ_REQUIRE(rc == KV_ERR_ARG && err.msg[0], "encode: status %d without a reason", rc);
    }
    /* decode of ids outside the vocabulary: "" rather than a read out of bounds */
    char bytes[2];
    FUZZ_REQUIRE(kv_tokenizer_decode(&t, 1, vocab, bytes)[0] == '\0', "decode(vocab) not empty");
    FUZZ_REQUIRE(kv_tokenizer_decode(&t, 1, -1, bytes)[0] == '\0', "decode(-1) not empty");
    free(ids);
    free(prompt);
    kv_tokenizer_free(&t);
    return 0;
}
