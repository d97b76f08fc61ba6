/* Generation loops (kv_generate.h), written once over a kv_backend.
 *
 * Step i (0-based) chooses token i from the logits after the prefix prompt + out[0..i-1]:
 *   naive:  reset the slot, run the whole prefix (n_prompt + i tokens) from position 0;
 *   cached: step 0 prefills the prompt; step i > 0 runs only out[i-1] at position n_prompt+i-1,
 *           attending to the keys and values earlier steps left in the cache.
 * Both feed the model the same tokens at the same positions, so they choose the same tokens;
 * the counters show what the cache saves. */
#include "kv_generate.h"

#include <stdlib.h>
#include <string.h>

/* One step's tokens through the backend, opts->prefill_step at a time (0: all at once), the
 * before_step hook ahead of each forward call; logits [vocab] are the last token's, the work
 * of every call is added to *step. */
static int forward_step(kv_backend *b, const kv_seq *seq, const kv_gen_opts *opts,
                        float *logits, kv_counters *step, kv_err *err)
{
    const int chunk = opts->prefill_step > 0 ? opts->prefill_step : seq->n_tokens;
    int rc = KV_OK;
    for (int done = 0; !rc && done < seq->n_tokens; done += chunk) {
        kv_seq s = *seq;
        s.pos += done;
        s.tokens += done;
        s.n_tokens = seq->n_tokens - done < chunk ? seq->n_tokens - done : chunk;
        if (opts->before_step) rc = opts->before_step(opts->hook, b, s.pos, s.n_tokens, err);
        if (!rc) rc = b->forward(b, &s, 1, logits, step, err);
    }
    return rc;
}

/* The loop of both entry points; stop = 1 ends after a BOS or EOS token. */
static int generate(kv_backend *b, const int *prompt, int n_prompt, const kv_gen_opts *opts,
                    int stop, int *out, int *n_out, kv_counters *total, kv_err *err)
{
    *n_out = 0;
    if (!b || !opts || !prompt) return kv_fail(err, KV_ERR_ARG, "kv_generate: NULL argument");
    if (opts->mode != KV_MODE_NAIVE && opts->mode != KV_MODE_CACHED)
        return kv_fail(err, KV_ERR_ARG, "kv_generate: unknown mode %d", opts->mode);
    if (n_prompt < 1)
        return kv_fail(err, KV_ERR_ARG, "kv_generate: n_prompt %d (need >= 1)", n_prompt);
    if (opts->n_steps < 0 || (opts->n_steps > 0 && !out))
        return kv_fail(err, KV_ERR_ARG, "kv_generate: n_steps %d with %s output", opts->n_steps,
                       out ? "an" : "no");
    if (opts->slot < 0 || opts->slot >= b->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "kv_generate: slot %d is outside [0, %d)", opts->slot,
                       b->spec.n_slots);
    const int vocab = b->config->vocab_size;
    if (opts->sampler && opts->sampler->vocab_size != vocab)
        return kv_fail(err, KV_ERR_ARG, "kv_generate: sampler vocab %d != model vocab %d",
                       opts->sampler->vocab_size, vocab);
    if ((int64_t)n_prompt + opts->n_steps > b->spec.capacity)
        return kv_fail(err, KV_ERR_CAPACITY,
                       "kv_generate: prompt %d + %d steps exceeds the cache capacity %d",
                       n_prompt, opts->n_steps, b->spec.capacity);
    if (opts->prefill_step < 0)
        return kv_fail(err, KV_ERR_ARG, "kv_generate: prefill_step %d (need >= 0)",
                       opts->prefill_step);
    if (opts->n_steps == 0) return KV_OK;

    const int n_all = n_prompt + opts->n_steps;
    int *prefix = malloc((size_t)n_all * sizeof(int)); /* [n_prompt + n_steps] */
    float *logits = malloc((size_t)vocab * sizeof(float)); /* [vocab] */
    if (!prefix || !logits) {
        free(prefix);
        free(logits);
        return kv_fail(err, KV_ERR_NOMEM, "kv_generate: out of memory");
    }
    memcpy(prefix, prompt, (size_t)n_prompt * sizeof(int));

    int rc = KV_OK;
    b->reset(b, opts->slot);
    for (int i = 0; i < opts->n_steps; i++) {
        const int n_prefix = n_prompt + i; /* tokens known before this step's choice */
        kv_seq seq = {opts->slot, 0, n_prefix, prefix};
        if (opts->mode == KV_MODE_NAIVE) {
            b->reset(b, opts->slot);
        } else if (i > 0) {
            seq.pos = n_prefix - 1;
            seq.n_tokens = 1;
            seq.tokens = prefix + n_prefix - 1;
        }
        kv_counters step = {0};
        const double t0 = kv_now();
        rc = forward_step(b, &seq, opts, logits, &step, err);
        if (rc) break;
        if (opts->last_logits && i == opts->n_steps - 1)
            memcpy(opts->last_logits, logits, (size_t)vocab * sizeof(float));
        /* NaN or inf logits (weights that overflow the forward pass) choose nothing: argmax
         * would say token 0 forever */
        if ((rc = kv_logits_check(logits, vocab, err))) break;
        const int token = opts->sampler ? kv_sample(opts->sampler, logits)
                                        : kv_argmax(logits, vocab);
        const double seconds = kv_now() - t0;
        prefix[n_prefix] = token;
        out[i] = token;
        if (total) {
            total->flops_proj += step.flops_proj;
            total->flops_attn += step.flops_attn;
            total->kv_bytes_read += step.kv_bytes_read;
            total->kv_bytes_written += step.kv_bytes_written;
            total->tokens += step.tokens;
            total->steps += step.steps;
        }
        *n_out = i + 1;
        if (opts->on_step) opts->on_step(opts->user, i, token, &step, seconds);
        /* llama2.c's BOS or EOS, or one of the caller's stop ids: the text has ended */
        int end = !opts->stop && (token == 1 || token == 2);
        for (int k = 0; opts->stop && k < opts->n_stop; k++) end |= token == opts->stop[k];
        if (stop && end) break;
    }
    free(prefix);
    free(logits);
    return rc;
}

int kv_generate(kv_backend *b, const int *prompt, int n_prompt, const kv_gen_opts *opts,
                int *out, kv_counters *total, kv_err *err)
{
    int n_out;
    return generate(b, prompt, n_prompt, opts, 0, out, &n_out, total, err);
}

int kv_generate_stop(kv_backend *b, const int *prompt, int n_prompt, const kv_gen_opts *opts,
                     int *out, int *n_out, kv_counters *total, kv_err *err)
{
    int n;
    const int rc = generate(b, prompt, n_prompt, opts, 1, out, &n, total, err);
    if (n_out) *n_out = n;
    return rc;
}
