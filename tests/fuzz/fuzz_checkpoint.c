/*
 * Fuzz target: checkpoint files (kv_checkpoint_read), every format: llama2.c's, kvlab's header
 * v1 and v2 (an MLA model, chapter 11).
 *
 * The input is the file. Whatever it holds, the reader must either refuse it with
 * KV_ERR_FORMAT / KV_ERR_IO, a message and a zeroed model, or load a model that keeps the
 * reader's promises: a valid config, exactly the weights that config needs, all finite. A
 * loaded model is then written back (kvlab format) and read again bit for bit, and run through
 * the CPU backend, whose cache is the one the model's attention kind reads (K and V planes, or
 * one latent row), for one step up to its cache capacity and one past it, which must be
 * refused, not overrun. So is its first layer alone (kv_model_layer_prefix(), speculation's
 * draft): a view of a model must carry everything a step reads.
 */
#include "fuzz_common.h"
#include "kv_backend.h"
#include "kv_checkpoint.h"
#include "kv_spec.h"

#include <math.h>

/* Run the model on a cache of capacity min(seq_len, 2): fill it, then ask for one more. A
 * valid model gets its backend unless the memory is not there. */
static void run_steps(const kv_model *m, const char *what)
{
    const int cap = m->config.seq_len < 2 ? m->config.seq_len : 2;
    kv_cache_spec spec = kv_cache_spec_default(1, cap);
    kv_backend *b = NULL;
    kv_err err = {{0}};
    int rc = kv_backend_cpu(&b, m, &spec, &err);
    FUZZ_REQUIRE(rc == KV_OK || rc == KV_ERR_NOMEM, "%s: a valid model's backend refused (%d): %s",
                 what, rc, err.msg);
    if (rc) return; /* too big */
    float *logits = malloc(sizeof(float) * (size_t)m->config.vocab_size); /* [vocab] */
    FUZZ_REQUIRE(logits != NULL, "out of memory");
    const int tok = m->config.vocab_size - 1;
    for (int pos = 0; pos <= cap; pos++) {
        kv_seq q = {0, pos, 1, &tok};
        rc = b->forward(b, &q, 1, logits, NULL, &err);
        if (pos < cap)
            FUZZ_REQUIRE(rc == KV_OK, "%s: step at pos %d of capacity %d failed: %s", what, pos,
                         cap, err.msg);
        else
            FUZZ_REQUIRE(rc == KV_ERR_CAPACITY && b->length(b, 0) == cap,
                         "%s: step past capacity %d returned %d, len %d", what, cap, rc,
                         b->length(b, 0));
    }
    free(logits);
    kv_backend_destroy(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[256], again[256];
    fuzz_path("ckpt", path, sizeof path);
    fuzz_path("ckpt2", again, sizeof again);
    fuzz_write(path, data, size);

    kv_model m;
    kv_err err = {{0}};
    int rc = kv_checkpoint_read(path, &m, &err);
    if (rc != KV_OK) {
        FUZZ_REQUIRE(rc == KV_ERR_FORMAT || rc == KV_ERR_IO, "unexpected status %d", rc);
        FUZZ_REQUIRE(err.msg[0] != '\0', "status %d without a message", rc);
        FUZZ_REQUIRE(m.data == NULL && m.n_floats == 0, "refused file left a model behind");
        remove(path);
        return 0;
    }
    FUZZ_REQUIRE(kv_config_validate(&m.config, NULL) == KV_OK, "loaded config does not validate");
    FUZZ_REQUIRE(m.n_floats == kv_config_param_count(&m.config), "weight count mismatch");
    for (int64_t i = 0; i < m.n_floats; i++)
        FUZZ_REQUIRE(isfinite(m.data[i]), "weight %lld is not finite", (long long)i);

    /* write it back and read it again: the same config and the same bits */
    FUZZ_REQUIRE(kv_checkpoint_write(again, &m, KV_FILE_KVLAB, &err) == KV_OK, "write: %s", err.msg);
    kv_model m2;
    FUZZ_REQUIRE(kv_checkpoint_read(again, &m2, &err) == KV_OK, "re-read: %s", err.msg);
    FUZZ_REQUIRE(memcmp(&m.config, &m2.config, sizeof m.config) == 0, "config changed on re-read");
    FUZZ_REQUIRE(m2.n_floats == m.n_floats &&
                     memcmp(m.data, m2.data, sizeof(float) * (size_t)m.n_floats) == 0,
                 "weights changed on re-read");
    kv_model_free(&m2);

    run_steps(&m, "the model");
    kv_model draft;
    FUZZ_REQUIRE(kv_model_layer_prefix(&draft, &m, 1, &err) == KV_OK, "layer prefix: %s", err.msg);
    run_steps(&draft, "its first layer");
    kv_model_free(&m);
    remove(path);
    remove(again);
    return 0;
}
