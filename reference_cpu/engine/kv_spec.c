/* Speculative decoding (kv_spec.h): the draft proposes, the target verifies in one step, the
 * caches roll back to the verified tokens.
 *
 * The context ctx holds the prompt and every emitted token; n is its length. Between rounds
 * both caches hold ctx[0 .. n-2] at most: the last token is never cached before a round,
 * because the step that processes it is the one that predicts what follows. A round:
 *   draft:  feed ctx[dlen .. n-1], choose d_0; feed d_0, choose d_1; ... kr calls
 *   target: feed ctx[tlen .. n-1], d_0 .. d_{kr-1} in one step, logits after every token:
 *           row (n-1-tlen) + j predicts position n + j, the slot d_j was proposed for
 *   accept: a prefix d_0 .. d_{acc-1}, then one token of the target's own at n + acc
 *   roll back: the target cached n + kr tokens and keeps n + acc (the context minus its new
 *           last token); the draft keeps at most as many. A window or KIVI cache copies back
 *           what the round overwrote from the undo log armed (rollback->speculate) before it.
 * The first round's target step is also the prompt's prefill. */
#include "kv_spec.h"
#include "kv_sampler.h"
#include "kv_linear.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int kv_model_layer_prefix(kv_model *view, const kv_model *m, int n_layers, kv_err *err)
{
    if (m && m->mats) /* a layer prefix of the handles would need its own classifier's place */
        return kv_model_need_fp32(m, "a draft of the model's first layers", err);
    if (!view || !m || !m->w.token_embedding)
        return kv_fail(err, KV_ERR_ARG, "kv_model_layer_prefix: NULL or empty model");
    if (n_layers < 1 || n_layers > m->config.n_layers)
        return kv_fail(err, KV_ERR_ARG, "kv_model_layer_prefix: %d layers, the model has %d",
                       n_layers, m->config.n_layers);
    /* every per-layer array is [L][...]: its first n_layers entries are a model's worth */
    memset(view, 0, sizeof *view);
    view->config = m->config;
    view->config.n_layers = n_layers;
    view->w = m->w;
    view->mla = m->mla; /* MLA: the layers' attention weights, [L] like the rest */
    return KV_OK;
}

double kv_spec_acceptance(const kv_spec_stats *st)
{
    return st && st->drafted > 0 ? (double)st->accepted / (double)st->drafted : 0.0;
}

/* Bytes one cached token takes in backend b: L · 2 · H_kv · d · b (the counters' formula);
 * an MLA model caches one latent row, L · (d_c + d_R) · b (kv_forward_mla.c). */
static double token_bytes(const kv_backend *b)
{
    const kv_config *c = b->config;
    if (c->attn == KV_ATTN_MLA) {
        const int r = kv_mla_row(&c->mla);
        return c->n_layers * (double)r * kv_cache_spec_bytes_per_element(&b->spec, c->n_layers, r);
    }
    const int d = kv_config_head_dim(c);
    return c->n_layers * 2.0 * c->n_kv_heads * d *
           kv_cache_spec_bytes_per_element(&b->spec, c->n_layers, d);
}

/* p [V] = softmax(logits / T), in double so the acceptance ratios are not rounded twice. */
static void softmax_t(double *p, const float *logits, int V, float T)
{
    float mx = logits[0];
    for (int i = 1; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double z = 0.0;
    for (int i = 0; i < V; i++) z += p[i] = exp(((double)logits[i] - mx) / T);
    for (int i = 0; i < V; i++) p[i] /= z;
}

/* Uniform in [0, 1) with 32 random bits. */
static double uniform(kv_rng *r) { return kv_rng_u32(r) * (1.0 / 4294967296.0); }

/* An index drawn from w [V] (non-negative, summing to z > 0). */
static int draw(kv_rng *r, const double *w, int V, double z)
{
    const double u = uniform(r) * z;
    double acc = 0.0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (w[i] <= 0.0) continue;
        acc += w[i];
        last = i;
        if (u < acc) return i;
    }
    return last; /* u landed in the rounding gap at the top */
}

/* Drop slot's cached tokens past len, counting the bytes. */
static int roll_back(kv_backend *b, int slot, int len, double *bytes, kv_err *err)
{
    const int have = b->length(b, slot);
    if (len >= have) return KV_OK;
    int rc = b->rollback->truncate(b, slot, len, err);
    if (!rc) *bytes += (have - len) * token_bytes(b);
    return rc;
}

/* KIVI: the quantized count row t of a plain run reads. A step's rows all read the count
 * after the whole step (the spill precedes the attention), while a plain run's decode row t
 * reads Q(t+1) and its prompt rows Q(n_prompt); so the verification is cut where that count
 * changes (at most once per 32 tokens), and each row reads what the plain run read: the same
 * logits, bit for bit. 0 for the other formats: one step. */
static int kivi_seen(const kv_cache_spec *spec, int n_prompt, int t)
{
    if (!kvq_is_kivi(spec->quant.dtype)) return 0;
    const int R = spec->quant.kivi_window ? spec->quant.kivi_window : KV_KIVI_WINDOW;
    const int e = t + 1 > n_prompt ? t + 1 : n_prompt;
    return e > R ? (e - R + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP * KV_KIVI_GROUP : 0;
}

static int check(const kv_backend *t, const kv_backend *d, const int *prompt, int n_prompt,
                 const kv_spec_opts *o, const int *out, kv_err *err)
{
    if (!t || !d || !prompt || !o || !out)
        return kv_fail(err, KV_ERR_ARG, "kv_spec_generate: NULL argument");
    if (o->k < 1 || o->k > 64)
        return kv_fail(err, KV_ERR_ARG, "kv_spec_generate: k %d outside [1, 64]", o->k);
    if (n_prompt < 1 || o->n_tokens < 1)
        return kv_fail(err, KV_ERR_ARG, "kv_spec_generate: %d prompt tokens, %d to emit "
                       "(need >= 1 each)", n_prompt, o->n_tokens);
    if (!(o->temperature >= 0.0f) || !isfinite(o->temperature))
        return kv_fail(err, KV_ERR_ARG, "kv_spec_generate: temperature %g", o->temperature);
    if (t->config->vocab_size != d->config->vocab_size)
        return kv_fail(err, KV_ERR_ARG, "kv_spec_generate: target vocabulary %d, draft %d",
                       t->config->vocab_size, d->config->vocab_size);
    if (!t->rollback || !d->rollback)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_spec_generate: the %s backend cannot "
                       "roll its cache back (no truncate)", !t->rollback ? t->name : d->name);
    const kv_backend *bs[2] = {t, d};
    for (int i = 0; i < 2; i++) {
        if (o->slot < 0 || o->slot >= bs[i]->spec.n_slots)
            return kv_fail(err, KV_ERR_ARG, "kv_spec_generate: slot %d outside the %s cache",
                           o->slot, i ? "draft" : "target");
        if ((int64_t)n_prompt + o->n_tokens > bs[i]->spec.capacity)
            return kv_fail(err, KV_ERR_CAPACITY, "kv_spec_generate: %d + %d tokens exceed the "
                           "%s cache's capacity %d", n_prompt, o->n_tokens,
                           i ? "draft" : "target", bs[i]->spec.capacity);
    }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= t->config->vocab_size)
            return kv_fail(err, KV_ERR_ARG, "kv_spec_generate: prompt token %d is %d", i,
                           prompt[i]);
    return KV_OK;
}

int kv_spec_generate(kv_backend *target, kv_backend *draft, const int *prompt, int n_prompt,
                     const kv_spec_opts *o, int *out, kv_spec_stats *st, kv_err *err)
{
    int rc = check(target, draft, prompt, n_prompt, o, out, err);
    if (rc) return rc;
    kv_spec_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    const int V = target->config->vocab_size, K = o->k, slot = o->slot;
    const int greedy = o->temperature == 0.0f;
    int *ctx = malloc(sizeof(int) * ((size_t)n_prompt + o->n_tokens + K)); /* prompt, emitted */
    float *tl = malloc(sizeof(float) * ((size_t)n_prompt + K) * V); /* [rows][V] target */
    float *dl = malloc(sizeof(float) * V);                           /* [V] draft, last token */
    double *q = malloc(sizeof(double) * (size_t)K * V);              /* [K][V] draft probs */
    double *p = malloc(sizeof(double) * V);                          /* [V] target probs */
    if (!ctx || !tl || !dl || !q || !p) {
        rc = kv_fail(err, KV_ERR_NOMEM, "kv_spec_generate: out of memory");
        goto done;
    }
    kv_rng rng;
    kv_rng_seed(&rng, o->seed);
    memcpy(ctx, prompt, sizeof(int) * n_prompt);
    target->reset(target, slot);
    draft->reset(draft, slot);

    int n = n_prompt, emitted = 0;
    while (emitted < o->n_tokens && !rc) {
        /* never draft past the last token asked for: the caches end as a plain run's */
        const int left = o->n_tokens - emitted - 1, kr = K < left ? K : left;
        /* a window's ring and KIVI's spills overwrite rows: log them before this round
         * writes, so the rollback below can copy them back (at most K tokens are dropped) */
        rc = target->rollback->speculate(target, slot, K, err);
        if (!rc) rc = draft->rollback->speculate(draft, slot, K, err);
        if (rc) break;
        for (int j = 0; j < kr && !rc; j++) { /* the draft proposes, one token per call */
            const int dlen = draft->length(draft, slot);
            const kv_seq s = {slot, dlen, n + j - dlen, ctx + dlen};
            rc = draft->forward(draft, &s, 1, dl, &st->draft, err);
            if (!rc) rc = kv_logits_check(dl, V, err); /* NaN would propose token 0 forever */
            if (rc) break;
            st->draft_steps++;
            if (greedy) {
                ctx[n + j] = kv_argmax(dl, V);
            } else {
                softmax_t(q + (size_t)j * V, dl, V, o->temperature);
                ctx[n + j] = draw(&rng, q + (size_t)j * V, V, 1.0);
            }
        }
        if (rc) break;
        /* the target runs the pending tokens and every draft in one step (a KIVI cache: one
         * step per stretch of rows that read the same quantized count, see kivi_seen()) */
        const int tlen = target->length(target, slot);
        for (int a = tlen, b; a < n + kr && !rc; a = b) {
            const int qa = kivi_seen(&target->spec, n_prompt, a);
            for (b = a + 1; b < n + kr && kivi_seen(&target->spec, n_prompt, b) == qa;) b++;
            const kv_seq s = {slot, a, b - a, ctx + a, tl + (size_t)(a - tlen) * V};
            rc = target->forward(target, &s, 1, NULL, &st->target, err);
        }
        for (int r = 0; r <= kr && !rc; r++) /* the rows read below: NaN chooses nothing */
            rc = kv_logits_check(tl + (size_t)(n - 1 - tlen + r) * V, V, err);
        if (rc) break;
        st->target_steps++;
        const float *row = tl + (size_t)(n - 1 - tlen) * V; /* predicts position n */
        int acc = 0, next = -1;
        for (; acc < kr; acc++, row += V) {
            const int d = ctx[n + acc];
            if (greedy) {
                const int a = kv_argmax(row, V);
                if (a != d) {
                    next = a;
                    break;
                }
                continue;
            }
            softmax_t(p, row, V, o->temperature);
            const double *qj = q + (size_t)acc * V;
            if (uniform(&rng) * qj[d] < p[d]) continue; /* kept with probability min(1, p/q) */
            double z = 0.0; /* rejected: the target's mass the draft under-proposed */
            for (int i = 0; i < V; i++) z += p[i] = p[i] > qj[i] ? p[i] - qj[i] : 0.0;
            next = z > 0.0 ? draw(&rng, p, V, z) : d; /* z = 0 only when p == q: never here */
            break;
        }
        if (next < 0) { /* every draft kept (or none made): the target's own next token */
            if (greedy) {
                next = kv_argmax(row, V);
            } else {
                softmax_t(p, row, V, o->temperature);
                next = draw(&rng, p, V, 1.0);
            }
        }
        ctx[n + acc] = next;
        st->drafted += kr;
        st->accepted += acc;
        n += acc + 1;
        emitted += acc + 1;
        /* only verified tokens stay: both caches keep at most the context minus its last */
        rc = roll_back(target, slot, n - 1, &st->target_kv_rolled_back, err);
        if (!rc) rc = roll_back(draft, slot, n - 1, &st->draft_kv_rolled_back, err);
    }
    if (!rc) memcpy(out, ctx + n_prompt, sizeof(int) * o->n_tokens);
    st->emitted = emitted;
    st->target_kv_written = st->target.kv_bytes_written;
    st->draft_kv_written = st->draft.kv_bytes_written;
done:
    free(ctx);
    free(tl);
    free(dl);
    free(q);
    free(p);
    return rc;
}
