/*
 * Fuzz target: multi-turn dialogues (kv_dialogue_parse, the datasets/dialogues/ format),
 * then rendering every turn for both recall models.
 *
 * The input is the dialogue text (up to its first NUL). A refused dialogue must come back as
 * KV_ERR_FORMAT with a message; an accepted one must render every turn into recall-vocabulary
 * tokens (or refuse with KV_ERR_CAPACITY when a turn does not fit the buffer), and the length
 * kv_dialogue_length() announces must be what rendering the turns (+ one reply each) gives.
 */
#include "fuzz_common.h"
#include "kv_dialogue.h"

#define MAX_TURN_TOKENS 8192

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    kv_dialogue d;
    kv_err err = {{0}};
    int rc = kv_dialogue_parse(text, "fuzz", &d, &err);
    free(text);
    if (rc != KV_OK) {
        FUZZ_REQUIRE(rc == KV_ERR_FORMAT && err.msg[0], "status %d, message '%s'", rc, err.msg);
        FUZZ_REQUIRE(d.turns == NULL && d.items == NULL, "refused dialogue left memory behind");
        return 0;
    }
    FUZZ_REQUIRE(d.n_turns >= 1, "accepted a dialogue with no turns");
    kv_recall_vocab v;
    kv_recall_vocab_get(&v);
    static int tokens[MAX_TURN_TOKENS]; /* [MAX_TURN_TOKENS] one rendered turn */
    const int kinds[2] = {KV_MODEL_RECALL_DIRECT, KV_MODEL_RECALL_INDUCTION};
    for (int k = 0; k < 2; k++) {
        long total = 0;
        int fits = 1;
        for (int t = 0; t < d.n_turns; t++) {
            int n = -1;
            rc = kv_dialogue_render(&d, t, kinds[k], tokens, MAX_TURN_TOKENS, &n, &err);
            if (rc == KV_ERR_CAPACITY) {
                fits = 0;
                continue;
            }
            FUZZ_REQUIRE(rc == KV_OK, "render turn %d: %s", t, err.msg);
            FUZZ_REQUIRE(n >= 1 && n <= MAX_TURN_TOKENS, "turn %d rendered %d tokens", t, n);
            for (int i = 0; i < n; i++)
                FUZZ_REQUIRE(tokens[i] >= 0 && tokens[i] < v.vocab_size, "turn %d token %d is %d", t,
                             i, tokens[i]);
            const int want = kv_dialogue_expected(&d, t);
            FUZZ_REQUIRE(want >= 0 && want < v.vocab_size, "turn %d expects token %d", t, want);
            total += n + 1; /* the turn and its one-token reply */
        }
        const int announced = kv_dialogue_length(&d, kinds[k]); /* called even when huge */
        if (fits)
            FUZZ_REQUIRE(announced == total, "kv_dialogue_length %d, rendering gives %ld",
                         announced, total);
    }
    kv_dialogue_free(&d);
    return 0;
}
