/*
 * Fuzz target: the sampler (kv_sampler.h): greedy, temperature and top-p over any logits.
 *
 * Input: byte 0 the vocabulary size (1..256), byte 1 the temperature, byte 2 top-p, byte 3 a
 * shape for the logits (raw floats from the rest of the input, flat, ties, one NaN, one +inf,
 * all -inf, one huge logit among tiny ones), bytes 4..11 the seed, then the logits (4 bytes
 * each, cycled; 0 when the input ends). Three draws per input.
 *
 * What must hold: kv_sample returns -1 exactly when kv_logits_check refuses the logits (NaN,
 * +inf, or nothing but -inf), and otherwise a token in [0, vocab) that can be drawn: the argmax
 * at temperature 0, and a token of probability > 0 under the same softmax otherwise (never a
 * -inf logit). ASan catches any read outside the candidate list (issue 28: cand[-1]).
 */
#include "fuzz_common.h"
#include "kv_ops.h"
#include "kv_sampler.h"

#include <math.h>

/* temperatures and top-p values from the edges: 0, denormal, tiny, usual, large */
static const float TEMPS[8] = {0.0f, 1e-40f, 1e-30f, 1e-3f, 0.5f, 1.0f, 2.0f, 100.0f};
static const float TOPS[8] = {1.0f, 1e-6f, 1e-3f, 0.01f, 0.5f, 0.9f, 0.999999f, 0.95f};

static float byte_float(const uint8_t *data, size_t size, size_t at)
{
    if (size <= 12) return 0.0f;
    const size_t n = size - 12;
    uint8_t b[4];
    for (int k = 0; k < 4; k++) b[k] = data[12 + (at * 4 + (size_t)k) % n];
    float f;
    memcpy(&f, b, 4);
    return f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 12) return 0;
    const int V = 1 + data[0];
    const float temperature = data[1] < 128 ? TEMPS[data[1] % 8] : (float)(data[1] - 127) / 16.0f;
    const float top_p = data[2] < 128 ? TOPS[data[2] % 8] : (float)(data[2] - 127) / 128.0f;
    const int shape = data[3] % 8;
    uint64_t seed;
    memcpy(&seed, data + 4, 8);

    static float logits[256], work[256], probs[256]; /* [V] */
    for (int i = 0; i < V; i++) {
        const float raw = byte_float(data, size, (size_t)i);
        switch (shape) {
        case 1: logits[i] = 0.0f; break;                             /* flat */
        case 2: logits[i] = (float)(i % 3);  break;                  /* ties */
        case 6: logits[i] = i == V / 2 ? 1e30f : -1e-30f; break;     /* one dominant */
        case 7: logits[i] = isfinite(raw) ? fmodf(raw, 8.0f) : 0.0f; break; /* finite */
        default: logits[i] = raw;
        }
    }
    if (shape == 3) logits[V - 1] = NAN;
    if (shape == 4) logits[0] = INFINITY;
    if (shape == 5)
        for (int i = 0; i < V; i++) logits[i] = -INFINITY;

    kv_sampler s;
    kv_err err = {{0}};
    FUZZ_REQUIRE(kv_sampler_init(&s, V, temperature, top_p, seed, &err) == KV_OK, "init: %s",
                 err.msg);
    const int refused = kv_logits_check(logits, V, &err) != KV_OK;
    FUZZ_REQUIRE(!refused || strstr(err.msg, "no finite logits"), "message '%s'", err.msg);
    for (int draw = 0; draw < 3; draw++) {
        memcpy(work, logits, (size_t)V * sizeof(float));
        const int t = kv_sample(&s, work);
        if (refused) {
            FUZZ_REQUIRE(t == -1, "refused logits gave token %d", t);
            continue;
        }
        FUZZ_REQUIRE(t >= 0 && t < V, "token %d outside [0, %d)", t, V);
        FUZZ_REQUIRE(logits[t] != -INFINITY, "token %d has logit -inf", t);
        if (temperature == 0.0f) {
            FUZZ_REQUIRE(t == kv_argmax(logits, V), "greedy gave %d, argmax %d", t,
                         kv_argmax(logits, V));
            continue;
        }
        /* the draw's own probabilities: the token must be one that can be drawn */
        const float max = logits[kv_argmax(logits, V)];
        for (int i = 0; i < V; i++) probs[i] = (logits[i] - max) / temperature;
        kv_softmax(probs, V);
        FUZZ_REQUIRE(probs[t] > 0.0f, "token %d of probability %g (T %g, top-p %g)", t,
                     (double)probs[t], (double)temperature, (double)top_p);
    }
    kv_sampler_free(&s);
    return 0;
}
