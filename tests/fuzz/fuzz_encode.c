/*
 * Fuzz target: encoding arbitrary text with the embedded byte tokenizer.
 *
 * The first byte picks the vocabulary size (259: bytes only, 354: + printable characters,
 * 512: the tiny models', 4096: the small model's, with longer merges); the rest is the text,
 * up to its first NUL. The byte tokenizer can spell every byte, so decoding the ids after BOS
 * must give back the text exactly: any lost, doubled or reordered byte is a failure.
 */
#include "fuzz_common.h"
#include "kv_tokenizer.h"

static kv_tokenizer toks[4];
static const int sizes[4] = {259, 354, 512, 4096};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const int which = data[0] & 3;
    kv_tokenizer *t = &toks[which];
    kv_err err;
    if (!t->vocab) /* built once per process: the target tests encode, not construction */
        FUZZ_REQUIRE(kv_tokenizer_bytes(t, sizes[which], &err) == KV_OK, "byte tokenizer: %s", err.msg);

    char *text = fuzz_text(data + 1, size - 1);
    const size_t n_text = strlen(text);
    int *ids = malloc(sizeof(int) * (n_text + 3)); /* [strlen + 3] */
    char *back = malloc(n_text + 1);               /* [strlen + 1] decoded text */
    FUZZ_REQUIRE(ids && back, "out of memory");
    int n = 0;
    FUZZ_REQUIRE(kv_tokenizer_encode(t, text, 1, 0, ids, &n, &err) == KV_OK, "encode: %s", err.msg);
    FUZZ_REQUIRE(n >= 1 && (size_t)n <= n_text + 2 && ids[0] == 1, "encode gave %d ids", n);

    size_t got = 0;
    char bytes[2];
    for (int i = 1; i < n; i++) {
        FUZZ_REQUIRE(ids[i] >= 3 && ids[i] < t->vocab_size, "id %d at %d", ids[i], i);
        const char *piece = kv_tokenizer_decode(t, ids[i - 1], ids[i], bytes);
        const size_t len = strlen(piece);
        FUZZ_REQUIRE(got + len <= n_text, "decoded text longer than the input");
        memcpy(back + got, piece, len);
        got += len;
    }
    FUZZ_REQUIRE(got == n_text && memcmp(back, text, n_text) == 0,
                 "decode(encode(text)) != text (vocab %d, %zu bytes, %zu back)", t->vocab_size,
                 n_text, got);
    free(back);
    free(ids);
    free(text);
    return 0;
}
