/* The MHA / GQA / MQA attention block of the forward pass (kv_attn_block.h): chapters 02-10.
 *
 * Per layer: q, k, v = Wq·xb, Wk·xb, Wv·xb; RoPE on q and k; every row's K and V written to
 * the cache; each row attends over its slot's cached rows (the attention family, or chapter
 * 09's kept sets); xb2 = Wo · the heads' outputs. Everything a cache spec chooses (format,
 * layout, window, retention) is the cache's or the attention family's business: this block
 * only calls them. A tensor-parallel rank (chapter 10) computes its shard's heads and its
 * columns of Wo, a partial sum the forward pass all-reduces. */
#include "kv_attn_block.h"
#include "kv_attention.h"
#include "kv_linear.h"
#include "kv_ops.h"
#include "kv_retain.h"
#include "kv_window.h"

/* Nothing of a cache spec is beyond this block: the spec's own checks (kv_cache_spec_check())
 * and the forward pass's (retention on a shard) say what does not compose. */
static int gqa_check(const kv_config *cfg, const kv_cache_spec *spec, const kv_shard *sh,
                     kv_err *err)
{
    (void)cfg, (void)spec, (void)sh, (void)err;
    return KV_OK;
}

/* a rank's cache holds its shard's KV heads */
static void gqa_cache_shape(kv_config *shape, const kv_shard *sh)
{
    if (sh) shape->n_kv_heads = sh->n_kv_heads;
}

/* per thread: one group's scores [G][max_len] and a row (kv_attention_scratch) */
static int gqa_begin(kv_attn_step *a, kv_err *err)
{
    const kv_cache_spec *sp = &a->c->spec;
    const int W = sp->window.size, S = sp->window.n_sinks;
    const int Hs = a->sh ? a->sh->n_q_heads : a->m->config.n_heads;
    a->max_len = 0; /* longest attention span of any row: scores scratch per thread */
    for (int i = 0; i < a->n_seqs; i++) {
        const int span = (int)kv_window_count(W, S, a->seqs[i].pos + a->seqs[i].n_tokens - 1);
        if (span > a->max_len) a->max_len = span;
    }
    const size_t att_floats = kv_attention_scratch(a->c, Hs, a->max_len);
    a->scratch = kv_calloc(att_floats * sizeof(float));
    if (!a->scratch)
        return kv_fail(err, KV_ERR_NOMEM, "kv_forward: could not allocate %.1f MiB of scores",
                       (double)att_floats * 4 / 1048576.0);
    return KV_OK;
}

/* x += Wo · attention(RoPE(Wq·xb), cache(RoPE(Wk·xb), Wv·xb)): this computes the Wo term */
static int gqa_layer(kv_attn_step *a, int l, kv_err *err)
{
    const kv_config *p = &a->m->config;
    const kv_shard *sh = a->sh;
    const kv_seq *seqs = a->seqs;
    kv_cache *c = a->c;
    kv_state *s = a->s;
    const int T = a->T, n_seqs = a->n_seqs;
    const int dim = p->dim, H = p->n_heads, d = kv_config_head_dim(p);
    /* chapter 10: the rank's query heads q0.. and KV heads kv0.. (the whole model without a
     * shard); qs, kvs: widths of its q and k/v rows */
    const int Hs = sh ? sh->n_q_heads : H, KVs = c->n_kv_heads; /* the cache's: checked */
    const int q0 = sh ? sh->q_head0 : 0, kv0 = sh ? sh->kv_head0 : 0;
    const int qs = Hs * d, kvs = KVs * d;
    /* The query is rotated at q_pos: its position, or its index in a KV_POS_CACHE window;
     * such a cache stores keys unrotated (attention rotates them by their cache index). */
    const int W = c->spec.window.size, S = c->spec.window.n_sinks;
    const int keys_at_cache_pos = W > 0 && c->spec.window.pos_scheme == KV_POS_CACHE;
    int rc = KV_OK;

    const kv_mat wq = kv_model_mat(a->m, KV_MAT_Q, l), wk = kv_model_mat(a->m, KV_MAT_K, l);
    const kv_mat wv = kv_model_mat(a->m, KV_MAT_V, l), wo = kv_model_mat(a->m, KV_MAT_O, l);
    rc = kv_linear(s->q, s->xb, &wq, T, q0 * d, qs, 0, dim, err);
    if (!rc) rc = kv_linear(s->k, s->xb, &wk, T, kv0 * d, kvs, 0, dim, err);
    if (!rc) rc = kv_linear(s->v, s->xb, &wv, T, kv0 * d, kvs, 0, dim, err);
    if (rc) return rc;
    kv_rope(s->q, s->q_pos, T, Hs, d, p->rotary_dim, a->rope_freq);
    if (!keys_at_cache_pos)
        kv_rope(s->k, s->tok_pos, T, KVs, d, p->rotary_dim, a->rope_freq);
    /* Rows' K/V first, so a prefill row can attend to the rows before it; one call per
     * sequence, whose rows are consecutive, so a quantized cache sees the whole chunk
     * (fp8 calibrates on a prefill, KIVI spills whole blocks: kv_cache.h). Without a
     * window that is one wave: every row written, then every row attends. A window's
     * ring reuses rows, so a wave only takes the rows that can be written before any of
     * them attends without overwriting what one of them reads (kv_window_chunk(): the
     * rows up to S+W at once, then one token per sequence per wave). */
    for (int i = 0; i < n_seqs; i++) s->done[i] = 0;
    for (;;) {
        int n_rows = 0; /* rows of this wave, listed in s->wave */
        for (int i = 0, t = 0; i < n_seqs; t += seqs[i].n_tokens, i++) {
            const int left = seqs[i].n_tokens - s->done[i], p0 = seqs[i].pos + s->done[i];
            if (left == 0) continue;
            const int n = kv_window_chunk(W, S, p0, left), t0 = t + s->done[i];
            rc = kv_cache_write_seq(c, l, seqs[i].slot, p0, n, s->k + (size_t)t0 * kvs,
                                    s->v + (size_t)t0 * kvs, err);
            if (rc) return rc;
            for (int j = 0; j < n; j++) s->wave[n_rows++] = t0 + j;
            s->done[i] += n;
        }
        if (n_rows == 0) break;
        if (c->retain) { /* chapter 09: each KV head reads only what its method keeps or
                          * picks (kv_retain.h); no window, so this wave was every row */
            for (int i = 0, t = 0; !rc && i < n_seqs; t += seqs[i].n_tokens, i++)
                rc = kv_retain_attend(c, l, seqs[i].slot, seqs[i].pos, seqs[i].n_tokens,
                                      s->q + (size_t)t * qs, s->xb + (size_t)t * qs, err);
            if (rc) return rc;
            break;
        }
        /* each (row, KV head) a group of G query heads: spread over the threads, or each
         * split over them when a wave has fewer groups than threads (kv_attention.h) */
        kv_attention_rows(c, l, n_rows, s->wave, s->tok_slot, s->tok_pos, s->q, s->xb, qs,
                          Hs, a->max_len, a->scratch); /* q, xb [T][Hs*d]: [T][dim] unsharded */
    }
    /* a rank multiplies its heads' columns of Wo: a partial sum, completed by the
     * all-reduce over the ranks (chapter 10) */
    return kv_linear(s->xb2, s->xb, &wo, T, 0, dim, q0 * d, qs, err);
}

const kv_attn_block kv_attn_gqa = {
    "gqa", gqa_check, kv_retain_cache_create, gqa_cache_shape,
    gqa_begin, gqa_layer, kv_attn_step_end, kv_counters_add_step,
};
