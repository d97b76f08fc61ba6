/* The transformer step on the CPU (kv_forward.h), written once for every chapter.
 *
 * A step is a batch of sequences, each adding n_tokens at its own position. The batch is
 * flattened into T rows (one per new token); each row remembers its slot and position, so
 * every matmul runs over all T rows at once and only attention cares which sequence a row
 * belongs to. Because each row is computed alone in a fixed order (kv_ops.h), a sequence's
 * logits are bit-identical whether it runs solo, in a batch, or on any number of threads. The
 * matrix products go through kv_linear() (kv_linear.h), over every row of the step at once:
 * fp32 weights get kv_matmul()'s bits, weights kept quantized the integer kernels. */
#include "kv_forward.h"
#include "kv_attn_block.h"
#include "kv_linear.h"
#include "kv_ops.h"
#include "kv_retain.h"
#include "kv_window.h"

#include <string.h>

/* ---- counters ---------------------------------------------------------------------------
 * Symbols: L layers, H query heads, H_kv KV heads, d head dim, b bytes per cached element,
 * dim = H·d, hidden the SwiGLU width, V the vocabulary.
 *
 *   P = L · (dim·H·d + 2·dim·H_kv·d + H·d·dim + 3·dim·hidden)   weights a token multiplies
 *                                                               (Wq, Wk, Wv, Wo, W1, W2, W3)
 *   flops_proj  += 2·P per new token + 2·dim·V per sequence (the classifier, last token only)
 *   flops_attn  += L · 4·H·d · (p+1)    per new token at position p: q·k and p·v over the
 *                                       p+1 positions 0..p it attends to, 2 FLOPs each
 *   kv_bytes_read    += L · 2·H_kv·d·b · (p+1)   per new token at position p (K and V of
 *                                                every position it attends to)
 *   kv_bytes_written += L · 2·H_kv·d·b           per new token
 * (b averaged over the layers, metadata included, for quantized caches: chapter 04)
 *
 * A sequence at position p0 adding n tokens attends over sum_{p=p0}^{p0+n-1} (p+1)
 *   = n·p0 + n(n+1)/2 positions in all, which is what is added below. Grouped-query heads
 * read each KV row once per KV head, hence H_kv in the bytes and H in the FLOPs.
 * With a window (chapter 06) a query attends min(p+1, S+W) positions instead: the sum is
 * kv_window_attended(), and per-token work stops growing once the cache is full. */
void kv_counters_add_step(kv_counters *cnt, const kv_config *c, const kv_cache_spec *spec,
                          const kv_seq *seqs, int n_seqs)
{
    if (!cnt) return;
    const double L = c->n_layers, H = c->n_heads, Hkv = c->n_kv_heads;
    const double d = kv_config_head_dim(c), dim = c->dim, hidden = c->hidden_dim;
    const double b = kv_cache_spec_bytes_per_element(spec, c->n_layers, kv_config_head_dim(c));
    const double P = L * (dim * H * d + 2.0 * dim * Hkv * d + H * d * dim + 3.0 * dim * hidden);
    for (int s = 0; s < n_seqs; s++) {
        const double n = seqs[s].n_tokens, p0 = seqs[s].pos;
        /* sum of (p+1), or of min(p+1, S+W) with a window, over the new tokens */
        const double attended = spec->window.size > 0
                                    ? kv_window_attended(spec->window.size, spec->window.n_sinks,
                                                         seqs[s].pos, seqs[s].n_tokens)
                                    : n * p0 + n * (n + 1.0) / 2.0;
        /* the classifier runs once, or once per token for a sequence asking for all_logits */
        const double n_cls = seqs[s].all_logits ? n : 1.0;
        cnt->flops_proj += 2.0 * P * n + 2.0 * dim * c->vocab_size * n_cls;
        cnt->flops_attn += L * 4.0 * H * d * attended;
        cnt->kv_bytes_read += L * 2.0 * Hkv * d * b * attended;
        cnt->kv_bytes_written += L * 2.0 * Hkv * d * b * n;
        cnt->tokens += seqs[s].n_tokens;
    }
    cnt->steps += 1;
}

/* ---- scratch ---------------------------------------------------------------------------- */

void kv_state_init(kv_state *s) { memset(s, 0, sizeof *s); }

void kv_state_free(kv_state *s)
{
    if (!s) return;
    float *bufs[] = {s->x, s->xb, s->xb2, s->q, s->k, s->v, s->hb, s->hb2, s->xlast};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kv_free(bufs[i]);
    kv_free(s->tok_slot);
    kv_free(s->tok_pos);
    kv_free(s->q_pos);
    kv_free(s->wave);
    kv_free(s->done);
    kv_state_init(s);
}

/* Make room for T rows and n_seqs sequences (buffers only grow; contents are not kept). */
static int state_reserve(kv_state *s, const kv_config *c, int T, int n_seqs, kv_err *err)
{
    if (T <= s->max_tokens && n_seqs <= s->max_seqs) return KV_OK;
    if (T < s->max_tokens) T = s->max_tokens;
    if (n_seqs < s->max_seqs) n_seqs = s->max_seqs;
    kv_state_free(s);
    const size_t rows = (size_t)T, f = sizeof(float);
    const size_t dim = (size_t)c->dim, qdim = (size_t)c->n_heads * kv_config_head_dim(c);
    const size_t kvdim = (size_t)kv_config_kv_dim(c), hidden = (size_t)c->hidden_dim;
    s->x = kv_calloc(rows * dim * f);
    s->xb = kv_calloc(rows * dim * f);
    s->xb2 = kv_calloc(rows * dim * f);
    s->q = kv_calloc(rows * qdim * f);
    s->k = kv_calloc(rows * kvdim * f);
    s->v = kv_calloc(rows * kvdim * f);
    s->hb = kv_calloc(rows * hidden * f);
    s->hb2 = kv_calloc(rows * hidden * f);
    s->xlast = kv_calloc(rows * dim * f); /* T >= n_seqs: every sequence has a token */
    s->tok_slot = kv_calloc(rows * sizeof(int));
    s->tok_pos = kv_calloc(rows * sizeof(int));
    s->q_pos = kv_calloc(rows * sizeof(int));
    s->wave = kv_calloc(rows * sizeof(int));
    s->done = kv_calloc((size_t)n_seqs * sizeof(int));
    if (!s->x || !s->xb || !s->xb2 || !s->q || !s->k || !s->v || !s->hb || !s->hb2 ||
        !s->xlast || !s->tok_slot || !s->tok_pos || !s->q_pos || !s->wave || !s->done) {
        kv_state_free(s);
        return kv_fail(err, KV_ERR_NOMEM,
                       "kv_forward: could not allocate scratch for %d tokens", T);
    }
    s->max_tokens = T;
    s->max_seqs = n_seqs;
    return KV_OK;
}

/* ---- the step --------------------------------------------------------------------------- */

/* Check the batch against the model and the cache before anything is touched, so a refused
 * step leaves the cache as it was. Returns the total number of new tokens in *T. */
int kv_batch_check(const char *who, const kv_config *cfg, const kv_shard *sh, const kv_cache *c,
                   const kv_seq *seqs, int n_seqs, int *T, kv_err *err)
{
    const kv_cache_spec *spec = &c->spec;
    /* the cache the model's attention block writes: a rank's KV heads, a latent row */
    const kv_attn_block *blk = kv_attn_block_of(cfg);
    if (!blk) return kv_fail(err, KV_ERR_ARG, "%s: attention kind %d has no block", who, cfg->attn);
    kv_config shape = *cfg;
    blk->cache_shape(&shape, sh);
    if (c->n_layers != shape.n_layers || c->n_kv_heads != shape.n_kv_heads ||
        c->head_dim != kv_config_head_dim(&shape))
        return kv_fail(err, KV_ERR_ARG, "%s: cache shape (L %d, H_kv %d, d %d) does not match "
                       "the model (L %d, H_kv %d, d %d)", who, c->n_layers, c->n_kv_heads,
                       c->head_dim, shape.n_layers, shape.n_kv_heads, kv_config_head_dim(&shape));
    if (!seqs || n_seqs < 1)
        return kv_fail(err, KV_ERR_ARG, "%s: empty batch (n_seqs %d)", who, n_seqs);
    if (n_seqs > spec->n_slots)
        return kv_fail(err, KV_ERR_ARG, "%s: %d sequences but the cache has %d slots", who,
                       n_seqs, spec->n_slots);
    int64_t total = 0;
    for (int i = 0; i < n_seqs; i++) {
        const kv_seq *q = &seqs[i];
        if (q->slot < 0 || q->slot >= spec->n_slots)
            return kv_fail(err, KV_ERR_ARG, "%s: sequence %d: slot %d is outside [0, %d)", who,
                           i, q->slot, spec->n_slots);
        for (int j = 0; j < i; j++)
            if (seqs[j].slot == q->slot)
                return kv_fail(err, KV_ERR_ARG,
                               "%s: sequences %d and %d both use slot %d", who, j, i, q->slot);
        if (q->n_tokens < 1)
            return kv_fail(err, KV_ERR_ARG, "%s: sequence %d: n_tokens %d (need >= 1)", who,
                           i, q->n_tokens);
        if (!q->tokens)
            return kv_fail(err, KV_ERR_ARG, "%s: sequence %d: tokens is NULL", who, i);
        if (q->pos != c->len[q->slot])
            return kv_fail(err, KV_ERR_ARG,
                           "%s: sequence %d: pos %d but slot %d holds %d tokens", who, i,
                           q->pos, q->slot, c->len[q->slot]);
        if ((int64_t)q->pos + q->n_tokens > spec->capacity)
            return kv_fail(err, KV_ERR_CAPACITY,
                           "%s: sequence %d: pos %d + %d tokens exceeds the capacity %d", who,
                           i, q->pos, q->n_tokens, spec->capacity);
        for (int t = 0; t < q->n_tokens; t++)
            if (q->tokens[t] < 0 || q->tokens[t] >= cfg->vocab_size)
                return kv_fail(err, KV_ERR_ARG,
                               "%s: sequence %d: token %d is %d, outside [0, %d)", who, i, t,
                               q->tokens[t], cfg->vocab_size);
        total += q->n_tokens;
    }
    if (total > (1 << 24))
        return kv_fail(err, KV_ERR_ARG, "%s: %lld tokens in one step (max %d)", who,
                       (long long)total, 1 << 24);
    *T = (int)total;
    return KV_OK;
}

int kv_forward(const kv_model *m, kv_cache *c, kv_state *s, const kv_seq *seqs, int n_seqs,
               float *logits, kv_counters *cnt, kv_err *err)
{
    return kv_forward_shard(m, c, s, NULL, seqs, n_seqs, logits, cnt, err);
}

int kv_forward_shard(const kv_model *m, kv_cache *c, kv_state *s, const kv_shard *sh,
                     const kv_seq *seqs, int n_seqs, float *logits, kv_counters *cnt,
                     kv_err *err)
{
    if (!m || !c || !s) return kv_fail(err, KV_ERR_ARG, "kv_forward: NULL model, cache or state");
    /* the model's attention block, chosen by its kind (kv_attn_block.h): no branch below */
    const kv_attn_block *blk = kv_attn_block_of(&m->config);
    if (!blk)
        return kv_fail(err, KV_ERR_ARG, "kv_forward: attention kind %d has no block",
                       m->config.attn);
    int T = 0;
    int rc = blk->check(&m->config, &c->spec, sh, err);
    if (!rc) rc = kv_batch_check("kv_forward", &m->config, sh, c, seqs, n_seqs, &T, err);
    if (!rc && c->tables) /* paged: every row written must fall in the slot's mapped blocks */
        rc = kv_cache_check_rows("kv_forward", c, seqs, n_seqs, err);
    if (!rc && c->spec.retain.select && sh) /* chapter 09's state is sized by the whole model's heads */
        rc = kv_fail(err, KV_ERR_UNSUPPORTED, "kv_forward: %s retention on a tensor-parallel "
                     "shard is not supported", kv_select_method_name(c->spec.retain.select));
    if (!rc && c->spec.retain.select && !c->retain) /* the engine composes the two */
        rc = kv_fail(err, KV_ERR_ARG, "kv_forward: the cache's spec selects with %s but it has "
                     "no retention state (build it with kv_retain_cache_create())",
                     kv_select_method_name(c->spec.retain.select));
    if (rc) return rc;
    rc = state_reserve(s, &m->config, T, n_seqs, err);
    if (rc) return rc;

    const kv_config *p = &m->config;
    const kv_weights *w = &m->w;
    const int dim = p->dim, hidden = p->hidden_dim;
    /* chapter 10: the rank's hidden units f0.. (the whole MLP without a shard) */
    const int f0 = sh ? sh->hidden0 : 0, fs = sh ? sh->n_hidden : hidden;

    /* flatten: row t is token tokens[j] of sequence i, at position pos + j of its slot.
     * q_pos: the position a query is rotated by, or its index in a KV_POS_CACHE window. */
    const int W = c->spec.window.size, S = c->spec.window.n_sinks;
    for (int i = 0, t = 0; i < n_seqs; i++) {
        for (int j = 0; j < seqs[i].n_tokens; j++, t++) {
            s->tok_slot[t] = seqs[i].slot;
            s->tok_pos[t] = seqs[i].pos + j;
            s->q_pos[t] = (int)kv_window_query_pos(W, S, c->spec.window.pos_scheme, seqs[i].pos + j);
        }
        kv_model_embed(m, seqs[i].tokens, seqs[i].n_tokens,
                       s->x + (size_t)(t - seqs[i].n_tokens) * dim);
    }
    kv_attn_step a = {m, c, s, sh, seqs, n_seqs, T, NULL, 0, {0}};
    kv_rope_freqs(p, a.rope_freq);
    rc = blk->begin(&a, err); /* the block's scratch for this step */
    if (rc) return rc;

    for (int l = 0; l < p->n_layers; l++) {
        /* attention block: x += the block's output projection of attention over the cache
         * (kv_forward_gqa.c: Wo · attention(RoPE(Wq·xb), cache(RoPE(Wk·xb), Wv·xb));
         * kv_forward_mla.c: Wo · latent attention over cache(c_KV ‖ k_R)) */
        kv_rmsnorm(s->xb, s->x, w->rms_att + (size_t)l * dim, T, dim, p->norm_eps);
        rc = blk->layer(&a, l, err); /* xb -> cache -> xb2 */
        if (rc) {
            blk->end(&a);
            return rc;
        }
        if (sh) sh->all_reduce(sh, s->xb2, (int64_t)T * dim);
        kv_add(s->x, s->xb2, (int64_t)T * dim);

        /* MLP block: x += W2 · (silu(W1·xb) * W3·xb) */
        kv_rmsnorm(s->xb, s->x, w->rms_ffn + (size_t)l * dim, T, dim, p->norm_eps);
        const kv_mat w1 = kv_model_mat(m, KV_MAT_GATE, l), w3 = kv_model_mat(m, KV_MAT_UP, l);
        const kv_mat w2 = kv_model_mat(m, KV_MAT_DOWN, l);
        rc = kv_linear(s->hb, s->xb, &w1, T, f0, fs, 0, dim, err);
        if (!rc) rc = kv_linear(s->hb2, s->xb, &w3, T, f0, fs, 0, dim, err);
        if (!rc) kv_swiglu(s->hb, s->hb2, (int64_t)T * fs);
        if (!rc) rc = kv_linear(s->xb2, s->hb, &w2, T, 0, dim, f0, fs, err);
        if (rc) {
            blk->end(&a);
            return rc;
        }
        if (sh) sh->all_reduce(sh, s->xb2, (int64_t)T * dim);
        kv_add(s->x, s->xb2, (int64_t)T * dim);
    }
    blk->end(&a);

    const kv_mat cls = kv_model_mat(m, KV_MAT_CLS, 0);
    /* chapter 10: a sequence that asks for all_logits gets the classifier over each of its
     * rows, row by row exactly as a one-token step would run it (kv_matmul computes each
     * output row alone), so row j equals the logits of a step ending at token j bit for bit */
    for (int i = 0, t = 0; i < n_seqs; t += seqs[i].n_tokens, i++) {
        if (!seqs[i].all_logits) continue;
        kv_rmsnorm(s->xlast, s->x + (size_t)t * dim, w->rms_final, seqs[i].n_tokens, dim,
                   p->norm_eps);
        rc = kv_linear(seqs[i].all_logits, s->xlast, &cls, seqs[i].n_tokens, 0,
                       p->vocab_size, 0, dim, err);
        if (rc) return rc;
    }
    /* only the last token of each sequence needs logits: the next token is chosen from it */
    if (logits) {
        for (int i = 0, t = 0; i < n_seqs; i++) {
            t += seqs[i].n_tokens;
            kv_rmsnorm(s->xlast + (size_t)i * dim, s->x + (size_t)(t - 1) * dim, w->rms_final,
                       1, dim, p->norm_eps);
        }
        rc = kv_linear(logits, s->xlast, &cls, n_seqs, 0, p->vocab_size, 0, dim, err);
        if (rc) return rc;
    }

    for (int i = 0; i < n_seqs; i++) c->len[seqs[i].slot] = seqs[i].pos + seqs[i].n_tokens;
    if (cnt) {
        blk->count(cnt, p, &c->spec, seqs, n_seqs); /* kv_counters_add_step() for MHA/GQA */
        /* the formula counts one classifier per sequence, or one per row with all_logits */
        for (int i = 0; i < n_seqs; i++) {
            if (!logits && !seqs[i].all_logits) /* no classifier was run */
                cnt->flops_proj -= 2.0 * (double)dim * p->vocab_size;
            if (logits && seqs[i].all_logits) /* both: the last row's ran twice */
                cnt->flops_proj += 2.0 * (double)dim * p->vocab_size;
        }
    }
    return KV_OK;
}

int kv_forward_cache_create(kv_cache *c, const kv_config *cfg, const kv_cache_spec *spec,
                            kv_err *err)
{
    const kv_attn_block *blk = kv_attn_block_of(cfg);
    if (!c || !spec || !blk)
        return kv_fail(err, KV_ERR_ARG, "kv_forward_cache_create: NULL argument or unknown "
                       "attention kind");
    int rc = blk->check(cfg, spec, NULL, err);
    return rc ? rc : blk->cache_create(c, cfg, spec, err);
}
