/*
 * Fuzz target: needle-grid specs (kv_needle_spec_parse, the datasets/needle/ format).
 *
 * The input is the spec text (up to its first NUL). A refused spec must come back as
 * KV_ERR_FORMAT with a message naming the line; an accepted one must hold only what the
 * grid runner can use: counts within the array sizes, lengths and depths in range, and
 * variants that either map to a cache spec or are refused by kv_needle_cache_spec by name.
 */
#include "fuzz_common.h"
#include "kv_needle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    kv_needle_spec s;
    kv_needle_spec_default(&s);
    kv_err err = {{0}};
    int rc = kv_needle_spec_parse(text, &s, &err);
    free(text);
    if (rc != KV_OK) {
        FUZZ_REQUIRE(rc == KV_ERR_FORMAT && err.msg[0], "status %d, message '%s'", rc, err.msg);
        return 0;
    }
    FUZZ_REQUIRE(memchr(s.name, '\0', sizeof s.name) != NULL, "name not terminated");
    FUZZ_REQUIRE(s.n_models >= 1 && s.n_models <= 2, "n_models %d", s.n_models);
    for (int i = 0; i < s.n_models; i++)
        FUZZ_REQUIRE(s.models[i] == KV_MODEL_RECALL_DIRECT || s.models[i] == KV_MODEL_RECALL_INDUCTION,
                     "model %d is kind %d", i, s.models[i]);
    FUZZ_REQUIRE(s.n_lengths >= 1 && s.n_lengths <= KV_NEEDLE_MAX_LENGTHS, "n_lengths %d", s.n_lengths);
    for (int i = 0; i < s.n_lengths; i++)
        FUZZ_REQUIRE(s.lengths[i] >= 16 && s.lengths[i] <= (1 << 24), "length %d", s.lengths[i]);
    FUZZ_REQUIRE(s.n_depths >= 1 && s.n_depths <= KV_NEEDLE_MAX_DEPTHS, "n_depths %d", s.n_depths);
    for (int i = 0; i < s.n_depths; i++)
        FUZZ_REQUIRE(s.depths[i] >= 0 && s.depths[i] <= 100, "depth %d", s.depths[i]);
    FUZZ_REQUIRE(s.n_variants >= 1 && s.n_variants <= KV_NEEDLE_MAX_VARIANTS, "n_variants %d", s.n_variants);
    FUZZ_REQUIRE(s.n_seeds >= 1 && s.n_seeds <= KV_NEEDLE_MAX_SEEDS, "n_seeds %d", s.n_seeds);
    FUZZ_REQUIRE(s.chunk >= 0 && s.chunk <= (1 << 24), "chunk %d", s.chunk);
    for (int i = 0; i < s.n_variants; i++) {
        const kv_needle_variant *v = &s.variants[i];
        FUZZ_REQUIRE(memchr(v->spec, '\0', sizeof v->spec) != NULL && v->spec[0], "variant %d spec", i);
        FUZZ_REQUIRE(v->rule >= KV_EXPECT_ALL && v->rule <= KV_EXPECT_FROM, "variant %d rule %d", i, v->rule);
        kv_cache_spec cs;
        rc = kv_needle_cache_spec(v->spec, 1, 64, &cs, &err);
        FUZZ_REQUIRE(rc == KV_OK || (rc == KV_ERR_UNSUPPORTED && err.msg[0]),
                     "variant '%s': status %d", v->spec, rc);
    }
    return 0;
}
