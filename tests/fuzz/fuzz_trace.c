/*
 * Fuzz target: request traces (kv_trace_parse, the datasets/traces/ CSV format).
 *
 * The input is the trace text (up to its first NUL). A refused trace must come back as
 * KV_ERR_FORMAT with a message; an accepted one must hold what kv_trace.h promises (arrivals
 * finite, >= 0 and in order; lengths in 1..KV_TRACE_MAX_LEN; fan-out in 1..KV_TRACE_MAX_FANOUT
 * and not both > 1; prefixes declared and shorter than their prompts; at least one request),
 * survive kv_trace_format + kv_trace_parse with every integer field unchanged, and give
 * prompt tokens inside the vocabulary.
 */
#include "fuzz_common.h"
#include "kv_trace.h"

#include <math.h>

static void check_trace(const kv_trace *t)
{
    FUZZ_REQUIRE(t->n >= 1 && t->req != NULL, "accepted a trace of %d requests", t->n);
    FUZZ_REQUIRE(t->n_prefixes >= 0 && t->n_prefixes <= KV_TRACE_MAX_PREFIXES, "n_prefixes %d",
                 t->n_prefixes);
    for (int i = 0; i < t->n; i++) {
        const kv_request *r = &t->req[i];
        FUZZ_REQUIRE(isfinite(r->arrival_s) && r->arrival_s >= 0.0, "request %d arrives at %g", i,
                     r->arrival_s);
        FUZZ_REQUIRE(i == 0 || r->arrival_s >= t->req[i - 1].arrival_s, "request %d out of order", i);
        FUZZ_REQUIRE(r->prompt_len >= 1 && r->prompt_len <= KV_TRACE_MAX_LEN, "request %d prompt %d",
                     i, r->prompt_len);
        FUZZ_REQUIRE(r->output_len >= 1 && r->output_len <= KV_TRACE_MAX_LEN, "request %d output %d",
                     i, r->output_len);
        FUZZ_REQUIRE(r->n_samples >= 1 && r->n_samples <= KV_TRACE_MAX_FANOUT && r->beam_width >= 1 &&
                         r->beam_width <= KV_TRACE_MAX_FANOUT && (r->n_samples == 1 || r->beam_width == 1),
                     "request %d fan-out %d x %d", i, r->n_samples, r->beam_width);
        if (r->prefix_id >= 0) {
            FUZZ_REQUIRE(r->prefix_id < KV_TRACE_MAX_PREFIXES && t->prefix_len[r->prefix_id] > 0,
                         "request %d uses undeclared prefix %d", i, r->prefix_id);
            FUZZ_REQUIRE(r->prompt_len > t->prefix_len[r->prefix_id], "request %d prompt %d <= prefix %d",
                         i, r->prompt_len, t->prefix_len[r->prefix_id]);
        } else {
            FUZZ_REQUIRE(r->prefix_id == -1, "request %d prefix_id %d", i, r->prefix_id);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    kv_trace t;
    memset(&t, 0, sizeof t);
    kv_err err = {{0}};
    int rc = kv_trace_parse(text, &t, &err);
    free(text);
    if (rc != KV_OK) {
        FUZZ_REQUIRE(rc == KV_ERR_FORMAT && err.msg[0], "status %d, message '%s'", rc, err.msg);
        kv_trace_free(&t); /* must be safe on whatever a refused parse left */
        return 0;
    }
    check_trace(&t);

    /* format and parse again: the same requests (arrivals may be rounded by the format) */
    char *again = NULL;
    FUZZ_REQUIRE(kv_trace_format(&t, "fuzz", &again, &err) == KV_OK, "format: %s", err.msg);
    kv_trace t2;
    memset(&t2, 0, sizeof t2);
    FUZZ_REQUIRE(kv_trace_parse(again, &t2, &err) == KV_OK, "re-parse: %s", err.msg);
    free(again);
    FUZZ_REQUIRE(t2.n == t.n, "re-parse gave %d requests, not %d", t2.n, t.n);
    for (int i = 0; i < t.n; i++) {
        const kv_request *a = &t.req[i], *b = &t2.req[i];
        FUZZ_REQUIRE(a->prompt_len == b->prompt_len && a->output_len == b->output_len &&
                         a->n_samples == b->n_samples && a->beam_width == b->beam_width &&
                         a->prefix_id == b->prefix_id && a->priority == b->priority,
                     "request %d changed in the round trip", i);
    }
    kv_trace_free(&t2);

    /* prompt tokens of short prompts: inside 1..vocab-1 */
    static int tokens[4096]; /* [prompt_len] */
    for (int i = 0; i < t.n && i < 16; i++) {
        if (t.req[i].prompt_len > 4096) continue;
        kv_trace_tokens(&t, i, 512, tokens);
        for (int j = 0; j < t.req[i].prompt_len; j++)
            FUZZ_REQUIRE(tokens[j] >= 1 && tokens[j] < 512, "request %d token %d is %d", i, j, tokens[j]);
    }
    kv_trace_free(&t);
    return 0;
}
